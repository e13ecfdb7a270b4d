//! Artifacts for workers that share no directory with the coordinator: a tree
//! travels as a tar stream cut into chunks of at most [`CHUNK`] bytes over
//! the `Artifacts` service, and lands in a local content-addressed cache.
//! Both ends digest what they receive themselves.

use std::io::{self, Read, Write};
use std::path::Path;

use steppe_proto::v1::artifacts_client::ArtifactsClient;
use steppe_proto::v1::{self, ArtifactChunk};
use steppe_runtime::artifacts::{pack_tar, ArtifactRef, ArtifactStore, LocalArtifactStore};
use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use steppe_runtime::auth::WithToken;

/// The largest piece of a tree in one message (the gRPC limit is 4 MiB).
pub const CHUNK: usize = 1 << 20;

/// An `io::Write` that cuts what is written into chunks and sends each as a
/// message (blocking: use it on a blocking thread).
pub struct ChunkWriter<T> {
    tx: mpsc::Sender<T>,
    wrap: fn(Vec<u8>) -> T,
    buf: Vec<u8>,
}

impl<T> ChunkWriter<T> {
    pub fn new(tx: mpsc::Sender<T>, wrap: fn(Vec<u8>) -> T) -> Self {
        ChunkWriter { tx, wrap, buf: Vec::with_capacity(CHUNK) }
    }

    fn send(&mut self) -> io::Result<()> {
        let data = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK));
        self.tx.blocking_send((self.wrap)(data)).map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the artifact stream closed"))
    }

    /// Sends what is left.
    pub fn finish(mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            self.send()?;
        }
        Ok(())
    }
}

impl<T> Write for ChunkWriter<T> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// An `io::Read` over chunks arriving on a channel (blocking: use it on a
/// blocking thread). An `Err` chunk ends the stream with that error.
pub struct ChunkReader {
    rx: mpsc::Receiver<Result<Vec<u8>, String>>,
    cur: io::Cursor<Vec<u8>>,
}

impl ChunkReader {
    pub fn new(rx: mpsc::Receiver<Result<Vec<u8>, String>>) -> Self {
        ChunkReader { rx, cur: io::Cursor::new(Vec::new()) }
    }
}

impl Read for ChunkReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            let n = self.cur.read(out)?;
            if n > 0 || out.is_empty() {
                return Ok(n);
            }
            match self.rx.blocking_recv() {
                Some(Ok(data)) => self.cur = io::Cursor::new(data),
                Some(Err(e)) => return Err(io::Error::other(e)),
                None => return Ok(0),
            }
        }
    }
}

/// Forwards a gRPC stream of chunks into a channel a [`ChunkReader`] reads.
pub async fn forward_chunks(mut stream: tonic::Streaming<ArtifactChunk>, tx: mpsc::Sender<Result<Vec<u8>, String>>) {
    loop {
        match stream.message().await {
            Ok(Some(c)) => {
                if tx.send(Ok(c.data)).await.is_err() {
                    return;
                }
            }
            Ok(None) => return,
            Err(e) => {
                let _ = tx.send(Err(e.message().to_string())).await;
                return;
            }
        }
    }
}

/// The artifact store of a worker that shares no directory with the
/// coordinator: a local cache in front of the coordinator's `Artifacts`
/// service. Its methods block; call them from a blocking thread.
pub struct StreamedArtifactStore {
    cache: LocalArtifactStore,
    channel: Channel,
    token: WithToken,
    rt: Handle,
}

fn remote_err(what: &str, s: tonic::Status) -> io::Error {
    io::Error::other(format!("{what} through the coordinator: {}", s.message()))
}

impl StreamedArtifactStore {
    pub fn new(cache_dir: &Path, channel: Channel, token: WithToken, rt: Handle) -> io::Result<Self> {
        Ok(StreamedArtifactStore { cache: LocalArtifactStore::new(cache_dir)?, channel, token, rt })
    }

    fn client(&self) -> ArtifactsClient<tonic::service::interceptor::InterceptedService<Channel, WithToken>> {
        ArtifactsClient::with_interceptor(self.channel.clone(), self.token.clone())
    }
}

impl ArtifactStore for StreamedArtifactStore {
    fn put_dir(&self, dir: &Path) -> io::Result<ArtifactRef> {
        let r = self.cache.put_dir(dir)?;
        let mut client = self.client();
        let wire = v1::ArtifactRef { digest: r.digest.clone() };
        let present = self.rt.block_on(client.has(wire)).map_err(|s| remote_err("checking an artifact", s))?.into_inner().present;
        if present {
            return Ok(r);
        }
        let (tx, rx) = mpsc::channel::<ArtifactChunk>(4);
        let upload = self.rt.spawn(async move { client.put(ReceiverStream::new(rx)).await });
        let mut w = ChunkWriter::new(tx, |data| ArtifactChunk { data });
        let packed = pack_tar(&self.cache.path_of(&r)?, &mut w).and_then(|()| w.finish());
        let stored = self.rt.block_on(upload).map_err(io::Error::other)?.map_err(|s| remote_err("storing an artifact", s))?.into_inner();
        packed?;
        if stored.digest != r.digest {
            return Err(io::Error::other(format!("the coordinator stored artifact {} as {}", r.digest, stored.digest)));
        }
        Ok(r)
    }

    fn materialize(&self, r: &ArtifactRef, dest: &Path) -> io::Result<()> {
        if !self.cache.has(r) {
            self.cache.path_of(r)?;
            let mut client = self.client();
            let stream = self
                .rt
                .block_on(client.fetch(v1::ArtifactRef { digest: r.digest.clone() }))
                .map_err(|s| remote_err(&format!("fetching artifact {}", r.digest), s))?
                .into_inner();
            let (tx, rx) = mpsc::channel(4);
            self.rt.spawn(forward_chunks(stream, tx));
            let got = self.cache.put_tar(&mut ChunkReader::new(rx))?;
            if got != *r {
                return Err(io::Error::other(format!("artifact {} arrived with digest {}", r.digest, got.digest)));
            }
        }
        self.cache.materialize(r, dest)
    }

    /// Only this worker's cached copy: the coordinator forgets its own.
    fn remove(&self, r: &ArtifactRef) -> io::Result<()> {
        self.cache.remove(r)
    }
}
