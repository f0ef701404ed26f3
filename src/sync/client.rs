//! The Kubernetes client from a kubeconfig or the in-cluster config: how `serve` and the
//! operator tools reach the API server. Owns no connection beyond the client it returns.

/// Why no client could be made.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot load kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("cannot create the Kubernetes client: {0}")]
    Client(#[from] kube::Error),
}

/// A client from a kubeconfig path (`KUBECONFIG`-style lists merged), or in-cluster/inferred
/// config without one. Shared by `serve` and the operator tools.
pub async fn kube_client_from(
    kubeconfig: Option<&std::path::Path>,
) -> Result<kube::Client, ClientError> {
    let config = match kubeconfig {
        Some(path) => {
            // KUBECONFIG may list several files (`a:b`), merged in order as kubectl does.
            let mut merged: Option<kube::config::Kubeconfig> = None;
            for part in std::env::split_paths(path.as_os_str()) {
                if part.as_os_str().is_empty() {
                    continue;
                }
                let next = kube::config::Kubeconfig::read_from(&part)
                    .map_err(|e| ClientError::Kubeconfig(format!("{}: {e}", part.display())))?;
                merged = Some(match merged {
                    None => next,
                    Some(acc) => acc
                        .merge(next)
                        .map_err(|e| ClientError::Kubeconfig(format!("{}: {e}", part.display())))?,
                });
            }
            let kubeconfig = merged.ok_or_else(|| {
                ClientError::Kubeconfig(format!("{}: no kubeconfig file given", path.display()))
            })?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(|e| ClientError::Kubeconfig(format!("{}: {e}", path.display())))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| ClientError::Kubeconfig(e.to_string()))?,
    };
    Ok(kube::Client::try_from(config)?)
}
