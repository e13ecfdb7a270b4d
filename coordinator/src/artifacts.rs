//! The Artifacts service: trees in and out of the coordinator's store for
//! workers that share no directory with it, as tar streams in chunks.

use steppe_proto::v1::artifacts_server::Artifacts;
use steppe_proto::v1::{ArtifactChunk, ArtifactRef, HasReply};
use steppe_runtime::artifacts::{self, LocalArtifactStore};
use steppe_worker::transfer::{forward_chunks, ChunkReader, ChunkWriter};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

pub struct ArtifactService {
    pub store: LocalArtifactStore,
}

fn reference(r: ArtifactRef) -> artifacts::ArtifactRef {
    artifacts::ArtifactRef { digest: r.digest }
}

#[tonic::async_trait]
impl Artifacts for ArtifactService {
    type FetchStream = ReceiverStream<Result<ArtifactChunk, Status>>;

    async fn fetch(&self, req: Request<ArtifactRef>) -> Result<Response<Self::FetchStream>, Status> {
        let r = reference(req.into_inner());
        let src = self.store.path_of(&r).map_err(|e| Status::invalid_argument(e.to_string()))?;
        if !src.is_dir() {
            return Err(Status::not_found(format!("artifact {} is not in the coordinator's store", r.digest)));
        }
        let (tx, rx) = mpsc::channel(4);
        tokio::task::spawn_blocking(move || {
            let failed = tx.clone();
            let mut w = ChunkWriter::new(tx, |data| Ok(ArtifactChunk { data }));
            if let Err(e) = artifacts::pack_tar(&src, &mut w).and_then(|()| w.finish()) {
                let _ = failed.blocking_send(Err(Status::internal(format!("packing artifact: {e}"))));
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn put(&self, req: Request<Streaming<ArtifactChunk>>) -> Result<Response<ArtifactRef>, Status> {
        use steppe_runtime::auth::{require, Identity, Role};
        // Workers store outputs; a submit token only reads what its runs stored.
        require(Identity::of(&req), &[Role::Worker, Role::Admin], "store artifacts")?;
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(forward_chunks(req.into_inner(), tx));
        let store = self.store.clone();
        let stored = tokio::task::spawn_blocking(move || store.put_tar(&mut ChunkReader::new(rx)))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(|e| Status::invalid_argument(format!("storing artifact: {e}")))?;
        Ok(Response::new(ArtifactRef { digest: stored.digest }))
    }

    async fn has(&self, req: Request<ArtifactRef>) -> Result<Response<HasReply>, Status> {
        Ok(Response::new(HasReply { present: self.store.has(&reference(req.into_inner())) }))
    }
}
