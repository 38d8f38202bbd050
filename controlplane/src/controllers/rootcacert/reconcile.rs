//! The root CA publisher's decision, free of I/O.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;

/// The ConfigMap's name.
pub const NAME: &str = "kube-root-ca.crt";
/// Its key.
pub const KEY: &str = "ca.crt";
/// Upstream's description annotation.
pub const DESCRIPTION_ANNOTATION: &str = "kubernetes.io/description";
pub const DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters.";

/// What to do about a namespace's ConfigMap.
#[derive(Debug, Clone, PartialEq)]
pub enum Publish {
    Nothing,
    Create(ConfigMap),
    /// Corrected: the data is exactly the CA, the description annotation is there.
    Update(ConfigMap),
}

/// The ConfigMap `namespace` should hold, given the one it has.
pub fn publish(namespace: &str, current: Option<&ConfigMap>, ca: &str) -> Publish {
    let data: BTreeMap<String, String> = [(KEY.to_string(), ca.to_string())].into_iter().collect();
    match current {
        None => Publish::Create(ConfigMap {
            metadata: ObjectMeta {
                name: Some(NAME.into()),
                namespace: Some(namespace.into()),
                annotations: Some(
                    [(DESCRIPTION_ANNOTATION.to_string(), DESCRIPTION.to_string())]
                        .into_iter()
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            data: Some(data),
            ..ConfigMap::default()
        }),
        Some(cm) => {
            let described = cm
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(DESCRIPTION_ANNOTATION))
                .is_some_and(|d| d == DESCRIPTION);
            if cm.data.as_ref() == Some(&data) && cm.binary_data.is_none() && described {
                return Publish::Nothing;
            }
            let mut fixed = cm.clone();
            fixed.data = Some(data);
            fixed.binary_data = None;
            fixed
                .metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(DESCRIPTION_ANNOTATION.into(), DESCRIPTION.into());
            Publish::Update(fixed)
        }
    }
}
