//! Artifacts in S3 (or an S3-compatible store: MinIO, GCS through its
//! interoperability endpoint): content-addressed like the local store, one
//! object per tree (`PREFIX/<digest>.tar`), so workers on any host read and
//! write them directly. A local cache stands in front.

use std::io;
use std::path::{Path, PathBuf};

use aws_sdk_s3::error::DisplayErrorContext;
use aws_sdk_s3::primitives::ByteStream;
use steppe_runtime::artifacts::{pack_tar, ArtifactRef, ArtifactStore, LocalArtifactStore};
use tokio::runtime::Handle;

pub struct S3ArtifactStore {
    cache: LocalArtifactStore,
    client: aws_sdk_s3::Client,
    bucket: String,
    prefix: String,
    /// `s3://BUCKET/PREFIX`, as messages show it.
    shown: String,
    rt: Handle,
}

/// `s3://BUCKET/PREFIX` → (bucket, prefix without slashes at its ends).
pub fn parse_url(url: &str) -> Result<(String, String), String> {
    let rest = url.strip_prefix("s3://").ok_or_else(|| format!("{url}: an S3 location is s3://BUCKET/PREFIX"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(format!("{url}: no bucket (s3://BUCKET/PREFIX)"));
    }
    Ok((bucket.to_string(), prefix.trim_matches('/').to_string()))
}

fn err(what: &str, shown: &str, e: impl std::error::Error) -> io::Error {
    io::Error::other(format!("{shown}: {what}: {}", DisplayErrorContext(&e)))
}

impl S3ArtifactStore {
    /// Opens `s3://BUCKET/PREFIX` (the bucket must exist) with a cache in
    /// `cache_dir`; `endpoint` overrides the environment's. An endpoint of
    /// one's own (MinIO, GCS, a local server) is addressed by path.
    pub async fn connect(url: &str, cache_dir: &Path, endpoint: Option<&str>) -> io::Result<Self> {
        let (bucket, prefix) = parse_url(url).map_err(io::Error::other)?;
        let conf = crate::sqs::aws_config(endpoint).await;
        let own_endpoint = endpoint.is_some() || std::env::var_os("AWS_ENDPOINT_URL").is_some() || std::env::var_os("AWS_ENDPOINT_URL_S3").is_some();
        let s3conf = aws_sdk_s3::config::Builder::from(&conf).force_path_style(own_endpoint).build();
        let client = aws_sdk_s3::Client::from_conf(s3conf);
        let shown = format!("s3://{bucket}/{prefix}");
        client.head_bucket().bucket(&bucket).send().await.map_err(|e| err("the bucket cannot be reached (does it exist, and may these credentials read it?)", &shown, e))?;
        Ok(S3ArtifactStore { cache: LocalArtifactStore::new(cache_dir)?, client, bucket, prefix, shown, rt: Handle::current() })
    }

    fn key(&self, r: &ArtifactRef) -> String {
        if self.prefix.is_empty() {
            format!("{}.tar", r.digest)
        } else {
            format!("{}/{}.tar", self.prefix, r.digest)
        }
    }

    /// Runs `f` to completion from sync code, on a runtime thread or off one.
    fn block<F: std::future::Future>(&self, f: F) -> F::Output {
        tokio::task::block_in_place(|| self.rt.block_on(f))
    }

    fn scratch_file(&self, r: &ArtifactRef, what: &str) -> PathBuf {
        self.cache.root().join(format!(".{}-{what}-{}.tar", r.digest, std::process::id()))
    }
}

impl ArtifactStore for S3ArtifactStore {
    fn put_dir(&self, dir: &Path) -> io::Result<ArtifactRef> {
        let r = self.cache.put_dir(dir)?;
        let key = self.key(&r);
        let present = self.block(self.client.head_object().bucket(&self.bucket).key(&key).send());
        match present {
            Ok(_) => return Ok(r),
            Err(e) if e.as_service_error().is_some_and(|s| s.is_not_found()) => {}
            Err(e) => return Err(err("checking an artifact", &self.shown, e)),
        }
        let file = self.scratch_file(&r, "up");
        let packed = std::fs::File::create(&file).and_then(|mut f| pack_tar(&self.cache.path_of(&r)?, &mut f));
        let sent = packed.and_then(|()| {
            self.block(async {
                let body = ByteStream::from_path(&file).await.map_err(io::Error::other)?;
                self.client.put_object().bucket(&self.bucket).key(&key).body(body).send().await.map_err(|e| err("storing an artifact", &self.shown, e))
            })
        });
        let _ = std::fs::remove_file(&file);
        sent.map(|_| r)
    }

    fn materialize(&self, r: &ArtifactRef, dest: &Path) -> io::Result<()> {
        if !self.cache.has(r) {
            // A digest from a peer becomes an object key only once checked.
            self.cache.path_of(r)?;
            let file = self.scratch_file(r, "down");
            let fetched = self.block(async {
                let got = self.client.get_object().bucket(&self.bucket).key(self.key(r)).send().await.map_err(|e| err(&format!("fetching artifact {}", r.digest), &self.shown, e))?;
                let mut body = got.body.into_async_read();
                let mut out = tokio::fs::File::create(&file).await?;
                tokio::io::copy(&mut body, &mut out).await?;
                io::Result::Ok(())
            });
            let stored = fetched.and_then(|()| std::fs::File::open(&file)).and_then(|mut f| self.cache.put_tar(&mut f));
            let _ = std::fs::remove_file(&file);
            let got = stored?;
            if got != *r {
                return Err(io::Error::other(format!("artifact {} arrived from {} with digest {}", r.digest, self.shown, got.digest)));
            }
        }
        self.cache.materialize(r, dest)
    }

    /// Only the cached copy: other runs may share the tree in the bucket
    /// (a lifecycle rule on the prefix expires old ones).
    fn remove(&self, r: &ArtifactRef) -> io::Result<()> {
        self.cache.remove(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Moto;

    #[test]
    fn s3_urls() {
        assert_eq!(parse_url("s3://b/p/q/"), Ok(("b".into(), "p/q".into())));
        assert_eq!(parse_url("s3://b"), Ok(("b".into(), String::new())));
        assert!(parse_url("s3:///x").is_err() && parse_url("gs://b").is_err());
    }

    /// A tree stored by one store (a worker) is read by another with an
    /// empty cache (a worker on another host), checked against its digest.
    #[tokio::test(flavor = "multi_thread")]
    async fn trees_travel_through_the_bucket() {
        let moto = Moto::start();
        let conf = crate::sqs::aws_config(Some(&moto.url)).await;
        let s3 = aws_sdk_s3::Client::from_conf(aws_sdk_s3::config::Builder::from(&conf).force_path_style(true).build());
        s3.create_bucket().bucket("arts").send().await.expect("bucket");
        let base = std::env::temp_dir().join(format!("steppe-s3-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("tree/sub")).unwrap();
        std::fs::write(base.join("tree/sub/f"), "hello").unwrap();
        let one = S3ArtifactStore::connect("s3://arts/steppe", &base.join("c1"), Some(&moto.url)).await.expect("connect");
        let two = S3ArtifactStore::connect("s3://arts/steppe", &base.join("c2"), Some(&moto.url)).await.expect("connect");
        let (base2, tree) = (base.clone(), base.join("tree"));
        let r = tokio::task::spawn_blocking(move || one.put_dir(&tree)).await.unwrap().expect("put");
        let listed = s3.list_objects_v2().bucket("arts").prefix("steppe/").send().await.unwrap();
        assert_eq!(listed.contents().len(), 1);
        assert_eq!(listed.contents()[0].key(), Some(format!("steppe/{}.tar", r.digest).as_str()));
        let r2 = r.clone();
        tokio::task::spawn_blocking(move || two.materialize(&r2, &base2.join("out"))).await.unwrap().expect("materialize");
        assert_eq!(std::fs::read_to_string(base.join("out/sub/f")).unwrap(), "hello");
        let missing = S3ArtifactStore::connect("s3://no-such-bucket/x", &base.join("c3"), Some(&moto.url)).await.err().expect("refused");
        assert!(missing.to_string().contains("s3://no-such-bucket/x"), "{missing}");
        let _ = std::fs::remove_dir_all(&base);
    }
}
