//! Table tests of the root CA publisher.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;

use super::reconcile::*;

fn data(cm: &ConfigMap) -> BTreeMap<String, String> {
    cm.data.clone().unwrap_or_default()
}

#[test]
fn missing_changed_or_undescribed_configmaps_are_published_again() {
    let Publish::Create(created) = publish("team", None, "CA") else {
        panic!("a missing ConfigMap is created");
    };
    assert_eq!(created.metadata.name.as_deref(), Some("kube-root-ca.crt"));
    assert_eq!(created.metadata.namespace.as_deref(), Some("team"));
    assert_eq!(data(&created), [("ca.crt".to_string(), "CA".to_string())].into());
    assert_eq!(
        created
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("kubernetes.io/description"))
            .map(String::as_str),
        Some(DESCRIPTION)
    );
    assert_eq!(publish("team", Some(&created), "CA"), Publish::Nothing);
    let mut tampered = created.clone();
    tampered.data = Some([("ca.crt".into(), "evil".into()), ("extra".into(), "x".into())].into());
    let Publish::Update(fixed) = publish("team", Some(&tampered), "CA") else {
        panic!("a changed ConfigMap is corrected");
    };
    assert_eq!(data(&fixed), [("ca.crt".to_string(), "CA".to_string())].into());
    let mut undescribed = created.clone();
    undescribed.metadata.annotations = None;
    assert!(matches!(
        publish("team", Some(&undescribed), "CA"),
        Publish::Update(_)
    ));
    // A new CA is published over the old one.
    assert!(matches!(
        publish("team", Some(&created), "CA2"),
        Publish::Update(_)
    ));
}
