//! Taints and tolerations: a toleration "permits but does not attract" (docs/SEEDS-SPEC.md
//! SCH-7). Used by the scheduler's filters and scores and by node admission.

use k8s_openapi::api::core::v1::{Taint, Toleration};

/// Whether `t` tolerates `taint`: an empty effect matches every effect, an empty key with
/// `Exists` matches every key, `Exists` matches any value, `Equal` (the default) the same value.
pub fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = t.effect.as_deref().filter(|e| !e.is_empty())
        && effect != taint.effect
    {
        return false;
    }
    let key = t.key.as_deref().unwrap_or_default();
    let exists = t.operator.as_deref() == Some("Exists");
    if key.is_empty() {
        return exists;
    }
    if key != taint.key {
        return false;
    }
    exists || t.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default()
}

/// The first taint with an effect in `effects` that no toleration tolerates.
pub fn first_untolerated<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
    effects: &[&str],
) -> Option<&'a Taint> {
    taints
        .iter()
        .filter(|t| effects.contains(&t.effect.as_str()))
        .find(|taint| !tolerations.iter().any(|t| tolerates(t, taint)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn taint(v: serde_json::Value) -> Taint {
        serde_json::from_value(v).expect("taint")
    }
    fn tol(v: serde_json::Value) -> Toleration {
        serde_json::from_value(v).expect("toleration")
    }

    #[test]
    fn toleration_rules() {
        let t = taint(json!({"key": "dedicated", "value": "backend", "effect": "NoSchedule"}));
        let cases = [
            (
                json!({"key": "dedicated", "operator": "Equal", "value": "backend", "effect": "NoSchedule"}),
                true,
            ),
            (json!({"key": "dedicated", "value": "backend"}), true),
            (json!({"key": "dedicated", "value": "frontend"}), false),
            (json!({"key": "dedicated", "operator": "Exists"}), true),
            (
                json!({"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}),
                false,
            ),
            (json!({"operator": "Exists"}), true),
            (json!({"operator": "Equal"}), false),
            (json!({"key": "other", "operator": "Exists"}), false),
        ];
        for (tv, want) in cases {
            assert_eq!(tolerates(&tol(tv.clone()), &t), want, "{tv}");
        }
    }

    #[test]
    fn first_untolerated_by_effect() {
        let taints = vec![
            taint(json!({"key": "a", "effect": "PreferNoSchedule"})),
            taint(json!({"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"})),
            taint(json!({"key": "b", "effect": "NoSchedule"})),
        ];
        let tols = vec![tol(
            json!({"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}),
        )];
        let found = first_untolerated(&taints, &tols, &["NoSchedule", "NoExecute"]);
        assert_eq!(found.map(|t| t.key.as_str()), Some("b"));
        assert!(first_untolerated(&taints[..2], &tols, &["NoSchedule", "NoExecute"]).is_none());
    }
}
