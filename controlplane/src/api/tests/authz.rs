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
        .may_connect(Some(&robot), "exec", "web", "default")
        .expect_err("no exec");
    assert_eq!(
        err.message,
        "pods \"web\" is forbidden: User \"system:serviceaccount:default:robot\" cannot create resource \"pods/exec\" in API group \"\" in the namespace \"default\""
    );
    let err = f
        .api
        .may_connect(Some(&robot), "portforward", "web", "default")
        .expect_err("no port-forward");
    assert_eq!(
        err.message,
        "pods \"web\" is forbidden: User \"system:serviceaccount:default:robot\" cannot create resource \"pods/portforward\" in API group \"\" in the namespace \"default\""
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

#[tokio::test]
async fn nodes_write_only_their_own_node_and_read_only_what_their_pods_use() {
    let f = fixture().await;
    let n1 = who("system:node:n1", &["system:nodes", "system:authenticated"]);
    let node =
        |name: &str| json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}).to_string();
    assert_eq!(
        f.as_user(&n1, Method::POST, "/api/v1/nodes", &node("n1")).await.0,
        201
    );
    let (code, st) = f.as_user(&n1, Method::POST, "/api/v1/nodes", &node("n2")).await;
    assert_eq!(code, 403);
    assert_eq!(
        st["message"],
        "nodes \"n2\" is forbidden: node \"n1\" is not allowed to modify node \"n2\""
    );
    assert_eq!(
        f.post("/api/v1/nodes", serde_json::from_str(&node("n2")).expect("json"))
            .await
            .0,
        201
    );
    let patch = |labels: Value| json!({"metadata": {"labels": labels}}).to_string();
    let merge = "application/merge-patch+json";
    let (code, st) = f
        .call_as(
            Some(&n1),
            Method::PATCH,
            "/api/v1/nodes/n2",
            merge,
            &patch(json!({"x": "y"})),
            "application/json",
        )
        .await;
    assert_eq!(
        (code, st["message"].as_str()),
        (
            403,
            Some("nodes \"n2\" is forbidden: node \"n1\" is not allowed to modify node \"n2\"")
        )
    );
    let (code, st) = f
        .call_as(
            Some(&n1),
            Method::PATCH,
            "/api/v1/nodes/n1",
            merge,
            &patch(json!({"node-restriction.kubernetes.io/role": "db"})),
            "application/json",
        )
        .await;
    assert_eq!(code, 403, "{st}");
    assert_eq!(
        st["message"],
        "nodes \"n1\" is forbidden: node \"n1\" is not allowed to modify labels: node-restriction.kubernetes.io/role"
    );
    let (code, _) = f
        .call_as(
            Some(&n1),
            Method::PATCH,
            "/api/v1/nodes/n1",
            merge,
            &patch(json!({"team": "a"})),
            "application/json",
        )
        .await;
    assert_eq!(code, 200, "its own ordinary labels");
    // Secrets: only those of pods bound to the node.
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tls"}, "data": {}});
    assert_eq!(f.post("/api/v1/namespaces/default/secrets", secret).await.0, 201);
    let (code, st) = f
        .as_user(&n1, Method::GET, "/api/v1/namespaces/default/secrets/tls", "")
        .await;
    assert_eq!(code, 403);
    assert_eq!(
        st["message"],
        "secrets \"tls\" is forbidden: User \"system:node:n1\" cannot get resource \"secrets\" in API group \"\" in the namespace \"default\": no relationship found between node 'n1' and this object"
    );
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}],
                 "volumes": [{"name": "tls", "secret": {"secretName": "tls"}}]}});
    assert_eq!(f.post("/api/v1/namespaces/default/pods", pod).await.0, 201);
    // The node graph follows the store's watch: the pod's edge appears within moments.
    let mut code = 0;
    for _ in 0..100 {
        code = f
            .as_user(&n1, Method::GET, "/api/v1/namespaces/default/secrets/tls", "")
            .await
            .0;
        if code == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(code, 200, "a secret of the node's pod");
    let n2 = who("system:node:n2", &["system:nodes"]);
    assert_eq!(
        f.as_user(&n2, Method::GET, "/api/v1/namespaces/default/secrets/tls", "")
            .await
            .0,
        403
    );
    assert_eq!(f.as_user(&n1, Method::GET, "/api/v1/pods", "").await.0, 403);
    assert_eq!(
        f.as_user(
            &n1,
            Method::GET,
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1",
            ""
        )
        .await
        .0,
        200
    );
    // Pod status: only for its own pods.
    let status = json!({"status": {"phase": "Running"}}).to_string();
    let uri = "/api/v1/namespaces/default/pods/web/status";
    assert_eq!(
        f.call_as(Some(&n2), Method::PATCH, uri, merge, &status, "application/json")
            .await
            .0,
        403
    );
    assert_eq!(
        f.call_as(Some(&n1), Method::PATCH, uri, merge, &status, "application/json")
            .await
            .0,
        200
    );
}

#[tokio::test]
async fn impersonation_and_access_reviews() {
    let f = fixture().await;
    let robot = who("system:serviceaccount:default:robot", &["system:serviceaccounts"]);
    let req = Request::builder()
        .method(Method::GET)
        .uri("/api/v1/namespaces/default/pods")
        .header("impersonate-user", "bob")
        .body(Bytes::new())
        .expect("request");
    let resp = f.api.handle(Some(&robot), req).await;
    assert_eq!(resp.status(), 403);
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    let st: Value = serde_json::from_slice(&body).expect("status");
    assert_eq!(
        st["message"],
        "users \"bob\" is forbidden: User \"system:serviceaccount:default:robot\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope"
    );
    let sar = |user: &str, verb: &str| {
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user, "resourceAttributes": {"namespace": "default", "verb": verb, "resource": "pods"}}})
    };
    let (code, out) = f
        .post(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            sar("robot", "list"),
        )
        .await;
    assert_eq!((code, &out["status"]["allowed"]), (201, &json!(false)));
    let (code, out) = f
        .post(
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            json!({"spec": {"nonResourceAttributes": {"path": "/version", "verb": "get"}}}),
        )
        .await;
    assert_eq!((code, &out["status"]["allowed"]), (201, &json!(true)));
    // Any authenticated caller may review itself, but not others.
    assert_eq!(
        f.as_user(
            &robot,
            Method::POST,
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            "{}"
        )
        .await
        .0,
        201
    );
    assert_eq!(
        f.as_user(
            &robot,
            Method::POST,
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            &sar("bob", "list").to_string()
        )
        .await
        .0,
        403
    );
}

#[tokio::test]
async fn bootstrap_token_secrets_authenticate_until_they_expire() {
    let f = fixture().await;
    let token = "abc123.0123456789abcdef";
    f.api
        .ensure_bootstrap_token(token, Some(Duration::from_secs(86_400)))
        .await
        .expect("token secret");
    let (_, stored) = f
        .get("/api/v1/namespaces/kube-system/secrets/bootstrap-token-abc123")
        .await;
    let expires = stored["data"]["expiration"]
        .as_str()
        .and_then(object::unb64)
        .and_then(|e| kcore::time::parse_rfc3339(&e))
        .expect("an expiration");
    let in_a_day = kcore::time::unix_seconds(std::time::SystemTime::now()) + 86_400;
    assert!(
        (in_a_day - 5..=in_a_day).contains(&expires),
        "{expires} vs {in_a_day}"
    );
    let holder = f
        .api
        .authenticate_bootstrap_token(token)
        .await
        .expect("authenticates");
    assert_eq!(holder.user, "system:bootstrap:abc123");
    assert_eq!(
        holder.groups,
        vec!["system:bootstrappers", "system:authenticated"]
    );
    assert!(
        f.api
            .authenticate_bootstrap_token("abc123.0123456789abcdee")
            .await
            .is_none()
    );
    assert!(
        f.api
            .authenticate_bootstrap_token("zzz999.0123456789abcdef")
            .await
            .is_none()
    );
    let expired = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "bootstrap-token-old123"}, "type": "bootstrap.kubernetes.io/token",
        "data": {"token-id": object::b64("old123"), "token-secret": object::b64("0123456789abcdef"),
                 "usage-bootstrap-authentication": object::b64("true"),
                 "expiration": object::b64("2020-01-01T00:00:00Z")}});
    assert_eq!(
        f.post("/api/v1/namespaces/kube-system/secrets", expired).await.0,
        201
    );
    assert!(
        f.api
            .authenticate_bootstrap_token("old123.0123456789abcdef")
            .await
            .is_none(),
        "an expired token fails"
    );
    // The holder creates and reads CSRs, and nothing else.
    let secrets = "/api/v1/namespaces/kube-system/secrets";
    assert_eq!(f.as_user(&holder, Method::GET, secrets, "").await.0, 403);
    let token_req = "/api/v1/namespaces/kube-system/serviceaccounts/default/token";
    assert_eq!(f.as_user(&holder, Method::POST, token_req, "{}").await.0, 403);
    let csrs = "/apis/certificates.k8s.io/v1/certificatesigningrequests";
    assert_eq!(f.as_user(&holder, Method::GET, csrs, "").await.0, 200);
    assert_eq!(f.as_user(&holder, Method::GET, "/api/v1/nodes", "").await.0, 403);
}

#[tokio::test]
async fn pods_get_a_projected_token_volume_and_bound_tokens_end_with_the_pod() {
    let f = fixture().await;
    let (code, created) = f.post("/api/v1/namespaces/default/pods", pod("web")).await;
    assert_eq!(code, 201);
    let volume = &created["spec"]["volumes"][0];
    let name = volume["name"].as_str().unwrap_or_default().to_string();
    assert!(
        name.starts_with("kube-api-access-") && name.len() == 21,
        "{volume}"
    );
    assert_eq!(
        volume["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"],
        3607
    );
    assert_eq!(
        volume["projected"]["sources"][1]["configMap"]["name"],
        "kube-root-ca.crt"
    );
    assert_eq!(
        created["spec"]["containers"][0]["volumeMounts"],
        json!([{"name": name, "readOnly": true, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}])
    );
    let mut opted_out = pod("quiet");
    opted_out["spec"]["automountServiceAccountToken"] = json!(false);
    let (_, created) = f.post("/api/v1/namespaces/default/pods", opted_out).await;
    assert!(created["spec"]["volumes"].is_null(), "{created}");
    // A token bound to the pod authenticates while the pod exists.
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = crate::pki::Pki::load_or_create(dir.path(), &["localhost".to_string()]).expect("pki");
    let api = f.api.clone().with_signer(Arc::new(pki));
    let (_, web) = f.get("/api/v1/namespaces/default/pods/web").await;
    let req = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "web", "uid": web["metadata"]["uid"]}}});
    let uri = "/api/v1/namespaces/default/serviceaccounts/default/token";
    let resp = api
        .handle(
            Some(&admin()),
            Request::builder()
                .method(Method::POST)
                .uri(uri)
                .header("content-type", "application/json")
                .body(Bytes::from(req.to_string()))
                .expect("request"),
        )
        .await;
    assert_eq!(resp.status(), 201);
    let body: Value =
        serde_json::from_slice(&resp.into_body().collect().await.expect("body").to_bytes()).expect("json");
    let token = body["status"]["token"].as_str().unwrap_or_default().to_string();
    let who = api
        .authenticate_token(&token)
        .await
        .expect("bound token authenticates");
    assert_eq!(who.user, "system:serviceaccount:default:default");
    assert_eq!(
        f.call(Method::DELETE, "/api/v1/namespaces/default/pods/web", "", "")
            .await
            .0,
        200
    );
    assert!(
        api.authenticate_token(&token).await.is_none(),
        "the pod is gone, so is the token"
    );
}

#[tokio::test]
async fn pods_need_their_service_account_and_mirror_pods_may_reference_none() {
    let f = fixture().await;
    let pods = "/api/v1/namespaces/default/pods";
    let mut ghost = pod("ghost");
    ghost["spec"]["serviceAccountName"] = json!("nobody");
    let (code, st) = f.post(pods, ghost.clone()).await;
    assert_eq!(code, 403, "{st}");
    assert_eq!(
        st["message"],
        "pods \"ghost\" is forbidden: error looking up service account default/nobody: serviceaccount \"nobody\" not found"
    );
    assert_eq!(f.get("/api/v1/namespaces/default/pods/ghost").await.0, 404);
    // A generated name is not known yet: the message names the prefix, as upstream's does.
    let mut generated = ghost.clone();
    generated["metadata"] = json!({"generateName": "ghost-"});
    let (code, st) = f.post(pods, generated).await;
    assert_eq!(code, 403);
    assert!(
        st["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("pods \"ghost-\" is forbidden: error looking up")),
        "{st}"
    );
    // Once the account exists (with pull secrets), the pod is admitted and gets them.
    let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "nobody"},
        "imagePullSecrets": [{"name": "regcred"}]});
    assert_eq!(
        f.post("/api/v1/namespaces/default/serviceaccounts", sa).await.0,
        201
    );
    let (code, created) = f.post(pods, ghost).await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(created["spec"]["serviceAccountName"], "nobody");
    assert_eq!(created["spec"]["imagePullSecrets"], json!([{"name": "regcred"}]));
    // The pod's own pull secrets win.
    let mut own = pod("own");
    own["spec"]["serviceAccountName"] = json!("nobody");
    own["spec"]["imagePullSecrets"] = json!([{"name": "mine"}]);
    let (_, created) = f.post(pods, own).await;
    assert_eq!(created["spec"]["imagePullSecrets"], json!([{"name": "mine"}]));
    // `default` is waited for (the ServiceAccount controller creates it after the namespace).
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fresh"}});
    assert_eq!(f.post("/api/v1/namespaces", ns).await.0, 201);
    let late = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}});
        f.post("/api/v1/namespaces/fresh/serviceaccounts", sa).await.0
    };
    let ((code, created), sa_code) =
        tokio::join!(f.post("/api/v1/namespaces/fresh/pods", pod("early")), late);
    assert_eq!(sa_code, 201);
    assert_eq!(code, 201, "{created}");
    assert_eq!(created["spec"]["serviceAccountName"], "default");
    // Mirror pods: no service account (none is defaulted), no secrets, no token projection.
    let mirror = |extra: Value| {
        let mut p = pod("static-web");
        p["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "hash"});
        if let (Some(spec), Some(extra)) = (p["spec"].as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        p
    };
    for (extra, why) in [
        (
            json!({"serviceAccountName": "default"}),
            "a mirror pod may not reference service accounts",
        ),
        (
            json!({"volumes": [{"name": "s", "secret": {"secretName": "x"}}]}),
            "a mirror pod may not reference secrets",
        ),
        (
            json!({"volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]}),
            "a mirror pod may not use ServiceAccountToken volume projections",
        ),
    ] {
        let (code, st) = f.post(pods, mirror(extra)).await;
        assert_eq!(code, 403, "{st}");
        assert_eq!(
            st["message"],
            format!("pods \"static-web\" is forbidden: {why}"),
            "{st}"
        );
    }
    let (code, created) = f.post(pods, mirror(json!({}))).await;
    assert_eq!(code, 201, "{created}");
    assert!(created["spec"]["serviceAccountName"].is_null(), "{created}");
    assert!(created["spec"]["volumes"].is_null(), "{created}");
}
