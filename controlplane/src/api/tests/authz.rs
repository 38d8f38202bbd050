//! Authorization through the handler: the exact upstream denials, bindings taking effect at
//! once, resource names, aggregation, the bootstrap policy and RBAC names.

use std::time::Duration;

use super::*;

fn who(user: &str, groups: &[&str]) -> Caller {
    Caller {
        user: user.into(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
    }
}

impl Fixture {
    async fn as_user(&self, c: &Caller, method: Method, uri: &str, body: &str) -> (u16, Value) {
        self.call_as(Some(c), method, uri, "application/json", body, "application/json")
            .await
    }
}

#[tokio::test]
async fn service_account_without_binding_gets_the_upstream_403() {
    let f = fixture().await;
    let robot = who(
        "system:serviceaccount:default:robot",
        &[
            "system:serviceaccounts",
            "system:serviceaccounts:default",
            "system:authenticated",
        ],
    );
    let (code, st) = f
        .as_user(&robot, Method::GET, "/api/v1/namespaces/default/pods", "")
        .await;
    assert_eq!(code, 403);
    assert_eq!(
        st["message"],
        "pods is forbidden: User \"system:serviceaccount:default:robot\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\""
    );
    assert_eq!(st["reason"], "Forbidden");
    assert_eq!(st["details"]["kind"], "pods");
    let (code, st) = f
        .as_user(
            &robot,
            Method::GET,
            "/api/v1/namespaces/kube-system/secrets/x",
            "",
        )
        .await;
    assert_eq!(code, 403);
    assert_eq!(
        st["message"],
        "secrets \"x\" is forbidden: User \"system:serviceaccount:default:robot\" cannot get resource \"secrets\" in API group \"\" in the namespace \"kube-system\""
    );
    let (code, st) = f
        .as_user(&robot, Method::GET, "/apis/apps/v1/deployments", "")
        .await;
    assert_eq!(code, 403);
    assert_eq!(
        st["message"],
        "deployments.apps is forbidden: User \"system:serviceaccount:default:robot\" cannot list resource \"deployments\" in API group \"apps\" at the cluster scope"
    );
    // Discovery is every authenticated caller's.
    assert_eq!(f.as_user(&robot, Method::GET, "/version", "").await.0, 200);
    assert_eq!(f.as_user(&robot, Method::GET, "/apis", "").await.0, 200);
    // Exec is authorized as create on pods/exec (the upgrade path shares the check).
    let err = f
        .api
        .may_exec(Some(&robot), "web", "default")
        .expect_err("no exec");
    assert_eq!(
        err.message,
        "pods \"web\" is forbidden: User \"system:serviceaccount:default:robot\" cannot create resource \"pods/exec\" in API group \"\" in the namespace \"default\""
    );
    let boot = who(
        "system:bootstrap:abcdef",
        &["system:bootstrappers", "system:authenticated"],
    );
    assert_eq!(
        f.as_user(&boot, Method::GET, "/api/v1/namespaces/kube-system/secrets", "")
            .await
            .0,
        403,
        "a bootstrap token reads no Secret"
    );
    assert_eq!(
        f.as_user(
            &boot,
            Method::POST,
            "/api/v1/namespaces/default/serviceaccounts/default/token",
            "{}"
        )
        .await
        .0,
        403,
        "a bootstrap token mints no token"
    );
    assert_eq!(
        f.as_user(
            &boot,
            Method::GET,
            "/apis/certificates.k8s.io/v1/certificatesigningrequests",
            ""
        )
        .await
        .0,
        200,
        "but reads CSRs"
    );
}

#[tokio::test]
async fn a_role_binding_grants_named_objects_at_once() {
    let f = fixture().await;
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "orders-config-reader"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["orders-flags"],
                   "verbs": ["get", "list", "watch"]}]});
    let rb = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "orders-config-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "orders", "namespace": "default"}],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "orders-config-reader"}});
    assert_eq!(
        f.post(
            "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles",
            role
        )
        .await
        .0,
        201
    );
    assert_eq!(
        f.post(
            "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings",
            rb
        )
        .await
        .0,
        201
    );
    let orders = who(
        "system:serviceaccount:default:orders",
        &["system:serviceaccounts"],
    );
    let cm = |name: &str| format!("/api/v1/namespaces/default/configmaps/{name}");
    assert_eq!(
        f.as_user(&orders, Method::GET, &cm("orders-flags"), "").await.0,
        404
    );
    assert_eq!(
        f.as_user(&orders, Method::GET, &cm("kube-root-ca.crt"), "")
            .await
            .0,
        403
    );
    assert_eq!(
        f.as_user(&orders, Method::GET, "/api/v1/namespaces/default/configmaps", "")
            .await
            .0,
        403,
        "resourceNames do not allow a list"
    );
    assert_eq!(
        f.as_user(
            &orders,
            Method::GET,
            "/api/v1/namespaces/default/configmaps?fieldSelector=metadata.name%3Dorders-flags",
            ""
        )
        .await
        .0,
        200,
        "a list narrowed to the name is allowed"
    );
    // Deleting the binding takes the grant away at once.
    let (code, _) = f
        .call(
            Method::DELETE,
            "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings/orders-config-reader",
            "",
            "",
        )
        .await;
    assert_eq!(code, 200);
    assert_eq!(
        f.as_user(&orders, Method::GET, &cm("orders-flags"), "").await.0,
        403
    );
}

#[tokio::test]
async fn bootstrap_policy_aggregation_and_names() {
    let f = fixture().await;
    let (code, crb) = f
        .get("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/system:coredns")
        .await;
    assert_eq!(code, 200);
    assert_eq!(crb["roleRef"]["name"], "system:coredns");
    assert_eq!(
        crb["subjects"],
        json!([{"kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system"}])
    );
    let (_, view) = f
        .get("/apis/rbac.authorization.k8s.io/v1/clusterroles/view")
        .await;
    assert!(
        view["rules"].as_array().is_some_and(|r| r.len() > 5),
        "view aggregates system:aggregate-to-view: {view}"
    );
    let (_, admin) = f
        .get("/apis/rbac.authorization.k8s.io/v1/clusterroles/admin")
        .await;
    let admin_rules = admin["rules"].to_string();
    assert!(
        admin_rules.contains("rolebindings") && admin_rules.contains("impersonate"),
        "admin aggregates edit and its own: {admin_rules}"
    );
    // A new role labelled for view is aggregated into view, then edit, then admin.
    let crd_reader = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "widgets-view", "labels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}},
        "rules": [{"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": ["get"]}]});
    assert_eq!(
        f.post("/apis/rbac.authorization.k8s.io/v1/clusterroles", crd_reader)
            .await
            .0,
        201
    );
    let mut aggregated = false;
    for _ in 0..50 {
        let (_, admin) = f
            .get("/apis/rbac.authorization.k8s.io/v1/clusterroles/admin")
            .await;
        if admin["rules"].to_string().contains("widgets") {
            aggregated = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(aggregated, "widgets reached admin through view and edit");
    // RBAC names are path segments: colons are fine, slashes are not.
    let named = |n: &str| json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": n}, "rules": []});
    assert_eq!(
        f.post(
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            named("team:reader")
        )
        .await
        .0,
        201
    );
    let (code, st) = f
        .post("/apis/rbac.authorization.k8s.io/v1/clusterroles", named("a%b"))
        .await;
    assert_eq!(code, 422, "{st}");
    // An edited bootstrap role gets its missing rules back at the next start; one opted out
    // of auto-update does not.
    let (_, mut basic) = f
        .get("/apis/rbac.authorization.k8s.io/v1/clusterroles/system:basic-user")
        .await;
    basic["rules"] = json!([]);
    let uri = "/apis/rbac.authorization.k8s.io/v1/clusterroles/system:basic-user";
    assert_eq!(
        f.call(Method::PUT, uri, "application/json", &basic.to_string())
            .await
            .0,
        200
    );
    f.api.reconcile_policy().await.expect("reconcile");
    let (_, basic) = f.get(uri).await;
    assert_eq!(basic["rules"].as_array().map(Vec::len), Some(2), "{basic}");
}
