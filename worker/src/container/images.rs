//! Images a step names: one on the engine is used as is; a missing one is
//! pulled (its progress said) when a registry answers, and otherwise the
//! step fails naming the image and how to make or load it.

use bollard::query_parameters::CreateImageOptionsBuilder;
use bollard::Docker;
use futures::StreamExt;

/// Whether the engine has `image`.
pub async fn present(docker: &Docker, image: &str) -> bool {
    docker.inspect_image(image).await.is_ok()
}

/// `image` on the engine, pulled when missing; `say` hears the pull's progress.
pub async fn ensure(docker: &Docker, image: &str, say: &(dyn Fn(&str) + Sync)) -> Result<(), String> {
    if present(docker, image).await {
        return Ok(());
    }
    say(&format!("pulling image {image}"));
    let (name, tag) = split_reference(image);
    let mut pull = docker.create_image(Some(CreateImageOptionsBuilder::default().from_image(name).tag(tag).build()), None, None);
    let mut last = String::new();
    let mut failure = None;
    while let Some(step) = pull.next().await {
        match step {
            Ok(info) => {
                // Layer-by-layer byte counts are left out: the phases are said once each.
                let status = info.status.unwrap_or_default();
                if status.is_empty() || status.starts_with("Downloading") || status.starts_with("Extracting") || status == last {
                    continue;
                }
                say(&format!("pulling image {image}: {}{status}", info.id.map(|i| format!("{i}: ")).unwrap_or_default()));
                last = status;
            }
            Err(e) => {
                failure = Some(e.to_string());
                break;
            }
        }
    }
    match failure {
        None if present(docker, image).await => Ok(()),
        why => Err(missing(image, why.as_deref().unwrap_or("the engine did not keep it"))),
    }
}

/// What `steppe validate` says of `image` on this machine's engine (None:
/// it is there); `engine` is [`super::engine`]'s answer.
pub async fn problem(engine: &Result<Docker, String>, image: &str) -> Option<String> {
    match engine {
        Err(e) => Some(format!("image \"{image}\": {e}, so steps with an image cannot run on this machine (start the Docker engine, or run them on a cluster whose workers reach one)")),
        Ok(d) if present(d, image).await => None,
        Ok(_) => Some(format!(
            "image \"{image}\" is not on this Docker engine; a run pulls it if a registry answers, else build it (docker build -t {image} …), load it (docker load -i FILE) or import a root filesystem (docker import ROOTFS.tar {image})"
        )),
    }
}

/// The message of an image that is neither on the engine nor pullable.
pub fn missing(image: &str, why: &str) -> String {
    format!(
        "image \"{image}\" is not on this Docker engine and could not be pulled ({why}): build it (docker build -t {image} …), load it (docker load -i FILE) or import a root filesystem (docker import ROOTFS.tar {image})"
    )
}

/// `name[:tag]` (a digest stays in the name); the tag defaults to `latest`.
fn split_reference(image: &str) -> (&str, &str) {
    if image.contains('@') {
        return (image, "");
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.rfind(':') {
        Some(i) => {
            let cut = image.len() - last.len() + i;
            (&image[..cut], &image[cut + 1..])
        }
        None => (image, "latest"),
    }
}

#[cfg(test)]
mod tests {
    use super::split_reference;

    #[test]
    fn references_split_into_name_and_tag() {
        assert_eq!(split_reference("golang:1.26"), ("golang", "1.26"));
        assert_eq!(split_reference("alpine/git"), ("alpine/git", "latest"));
        assert_eq!(split_reference("localhost:5000/team/app:v2"), ("localhost:5000/team/app", "v2"));
        assert_eq!(split_reference("localhost:5000/app"), ("localhost:5000/app", "latest"));
        assert_eq!(split_reference("app@sha256:abc"), ("app@sha256:abc", ""));
    }
}
