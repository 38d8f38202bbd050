//! A pod's DNS settings (its `/etc/resolv.conf`) from `dnsPolicy` and `dnsConfig`, as the
//! kubelet forms them (pkg/kubelet/network/dns): the node's resolver settings as the base for
//! `Default` (and for `ClusterFirst` on the node's network), none for `None`, then the pod's
//! `dnsConfig` appended (duplicates omitted, options merged by name) and cut to the resolver's
//! limits. This node has no cluster DNS server configured, so `ClusterFirst` falls back to
//! `Default` with the kubelet's `MissingClusterDNS` warning.

use k8s_openapi::api::core::v1::Pod;
use runtime_api::Dns;

/// What the resolver reads at most: 3 nameservers (glibc's MAXNS), 32 search domains of 2,048
/// characters in all (the kubelet's limits since 1.28).
const MAX_NAMESERVERS: usize = 3;
const MAX_SEARCHES: usize = 32;
const MAX_SEARCH_CHARS: usize = 2048;
/// A DNS subdomain's longest name.
const MAX_SEARCH_NAME: usize = 253;

/// The node's resolver settings, as the kubelet parses its `--resolv-conf`: every `nameserver`
/// line's address; the last `search` line's domains (without a trailing dot; `.` alone is
/// dropped); every `options` line, later ones overriding earlier ones of the same name.
/// `#` and `;` start comments.
pub fn parse_resolv_conf(text: &str) -> Dns {
    let mut dns = Dns::default();
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or_default();
        let mut fields = line.split_whitespace();
        match fields.next() {
            Some("nameserver") => dns.servers.extend(fields.next().map(str::to_string)),
            Some("search") => {
                dns.searches = fields
                    .filter(|s| *s != ".")
                    .map(|s| s.strip_suffix('.').unwrap_or(s).to_string())
                    .collect();
            }
            Some("options") => dns.options = merge_options(&dns.options, fields.map(str::to_string)),
            _ => {}
        }
    }
    dns
}

/// `base` with `more` merged in by option name (`ndots:5` is named `ndots`); a later value wins.
/// Sorted by name (the kubelet's order comes from a Go map, so any order is upstream's).
fn merge_options(base: &[String], more: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut by_name = std::collections::BTreeMap::new();
    for o in base.iter().cloned().chain(more) {
        let name = o.split(':').next().unwrap_or_default().to_string();
        by_name.insert(name, o);
    }
    by_name.into_values().collect()
}

/// `a` then the items of `b` not in it yet, each once.
fn append_unique(a: &[String], b: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for s in a.iter().cloned().chain(b) {
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

/// The kubelet's `MissingClusterDNS` warning about the node (recorded with each pod's).
pub const MISSING_CLUSTER_DNS: &str = "kubelet does not have ClusterDNS IP configured and cannot create Pod using \"ClusterFirst\" policy. Falling back to \"Default\" policy.";

/// The message of the `MissingClusterDNS` warning about `pod` (`format.Pod`: name_ns(uid)).
fn missing_cluster_dns(pod: &Pod) -> String {
    let m = &pod.metadata;
    format!(
        "pod: \"{}_{}({})\". {MISSING_CLUSTER_DNS}",
        m.name.as_deref().unwrap_or_default(),
        m.namespace.as_deref().unwrap_or("default"),
        m.uid.as_deref().unwrap_or_default()
    )
}

/// A warning the kubelet records while forming a pod's DNS settings: reason and message.
pub type Warning = (&'static str, String);

/// The pod's DNS settings from the node's (`node`), and the warnings to record.
pub fn pod_dns(pod: &Pod, node: &Dns) -> (Dns, Vec<Warning>) {
    let spec = pod.spec.as_ref();
    let policy = spec
        .and_then(|s| s.dns_policy.as_deref())
        .unwrap_or("ClusterFirst");
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    let mut warnings = Vec::new();
    let mut dns = match policy {
        "None" => Dns::default(),
        "Default" => node.clone(),
        // On the node's network `ClusterFirst` means `Default` (only
        // `ClusterFirstWithHostNet` asks for the cluster's server there).
        "ClusterFirst" if host_network => node.clone(),
        // `ClusterFirst`, `ClusterFirstWithHostNet` (and anything else, as the kubelet): the
        // cluster's server, which this node does not have.
        _ => {
            warnings.push(("MissingClusterDNS", missing_cluster_dns(pod)));
            node.clone()
        }
    };
    if let Some(c) = spec.and_then(|s| s.dns_config.as_ref()) {
        dns.servers = append_unique(&dns.servers, c.nameservers.iter().flatten().cloned());
        dns.searches = append_unique(&dns.searches, c.searches.iter().flatten().cloned());
        let options = c.options.iter().flatten().filter_map(|o| {
            let name = o.name.as_deref()?;
            Some(match o.value.as_deref() {
                Some(v) if !v.is_empty() => format!("{name}:{v}"),
                _ => name.to_string(),
            })
        });
        dns.options = merge_options(&dns.options, options);
    }
    if dns.servers.len() > MAX_NAMESERVERS {
        dns.servers.truncate(MAX_NAMESERVERS);
        warnings.push((
            "DNSConfigForming",
            format!(
                "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: {}",
                dns.servers.join(" ")
            ),
        ));
    }
    // Search domains: at most 32, none longer than a DNS name (some resolvers abort on one),
    // and as many of the last as needed dropped for the line to fit 2,048 characters.
    let before = dns.searches.len();
    dns.searches.truncate(MAX_SEARCHES);
    dns.searches.retain(|s| s.len() <= MAX_SEARCH_NAME);
    let mut chars = 0;
    let fits = dns
        .searches
        .iter()
        .take_while(|s| {
            chars += s.len() + usize::from(chars > 0);
            chars <= MAX_SEARCH_CHARS
        })
        .count();
    dns.searches.truncate(fits);
    if dns.searches.len() < before {
        warnings.push((
            "DNSConfigForming",
            format!(
                "Search Line limits were exceeded, some search paths have been omitted, the applied search line is: {}",
                dns.searches.join(" ")
            ),
        ));
    }
    (dns, warnings)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodDNSConfig, PodDNSConfigOption, PodSpec};

    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn dns(servers: &[&str], searches: &[&str], options: &[&str]) -> Dns {
        Dns {
            servers: strings(servers),
            searches: strings(searches),
            options: strings(options),
        }
    }

    #[test]
    fn the_nodes_resolv_conf_is_read_as_the_kubelet_reads_it() {
        let text = "# written by DHCP\nnameserver 10.0.2.3\nnameserver 10.0.2.4 ; second\n\
                    search old.example\nsearch corp.example. . lab.example\n\
                    options ndots:2 rotate\noptions ndots:3\nbogus line\n";
        assert_eq!(
            parse_resolv_conf(text),
            dns(
                &["10.0.2.3", "10.0.2.4"],
                &["corp.example", "lab.example"],
                &["ndots:3", "rotate"]
            )
        );
        assert_eq!(parse_resolv_conf(""), Dns::default());
    }

    fn pod(policy: Option<&str>, host_network: bool, config: Option<PodDNSConfig>) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("web".into());
        p.metadata.namespace = Some("shop".into());
        p.metadata.uid = Some("u-1".into());
        p.spec = Some(PodSpec {
            dns_policy: policy.map(str::to_string),
            host_network: Some(host_network),
            dns_config: config,
            ..PodSpec::default()
        });
        p
    }

    #[test]
    fn each_policy_starts_from_its_base() {
        let node = dns(&["10.0.2.3"], &["corp.example"], &["ndots:2"]);
        let warning = "pod: \"web_shop(u-1)\". kubelet does not have ClusterDNS IP configured and cannot create Pod using \"ClusterFirst\" policy. Falling back to \"Default\" policy.";
        let table = [
            (None, false, Some(warning)),
            (Some("ClusterFirst"), false, Some(warning)),
            (Some("ClusterFirst"), true, None),
            (Some("ClusterFirstWithHostNet"), true, Some(warning)),
            (Some("Default"), false, None),
        ];
        for (policy, host, want) in table {
            let (got, w) = pod_dns(&pod(policy, host, None), &node);
            assert_eq!(got, node, "{policy:?} host={host}");
            let want: Vec<Warning> = want
                .map(|m| ("MissingClusterDNS", m.to_string()))
                .into_iter()
                .collect();
            assert_eq!(w, want, "{policy:?} host={host}");
        }
        let none = pod(
            Some("None"),
            false,
            Some(PodDNSConfig {
                nameservers: Some(strings(&["1.1.1.1"])),
                ..PodDNSConfig::default()
            }),
        );
        assert_eq!(pod_dns(&none, &node), (dns(&["1.1.1.1"], &[], &[]), Vec::new()));
    }

    #[test]
    fn dns_config_is_appended_without_duplicates_and_options_merge_by_name() {
        let node = dns(&["10.0.2.3"], &["corp.example"], &["ndots:2", "rotate"]);
        let option = |name: &str, value: Option<&str>| PodDNSConfigOption {
            name: Some(name.into()),
            value: value.map(str::to_string),
        };
        let config = PodDNSConfig {
            nameservers: Some(strings(&["10.0.2.3", "192.0.2.1"])),
            searches: Some(strings(&["ns1.svc.example", "corp.example"])),
            options: Some(vec![
                option("ndots", Some("5")),
                option("edns0", None),
                option("timeout", Some("")),
            ]),
        };
        let (got, _) = pod_dns(&pod(Some("Default"), false, Some(config)), &node);
        assert_eq!(
            got,
            dns(
                &["10.0.2.3", "192.0.2.1"],
                &["corp.example", "ns1.svc.example"],
                &["edns0", "ndots:5", "rotate", "timeout"]
            )
        );
    }

    #[test]
    fn the_resolvers_limits_cut_the_lists() {
        let node = dns(&["10.0.0.1", "10.0.0.2"], &[], &[]);
        let many: Vec<String> = (0..40).map(|i| format!("d{i}.example")).collect();
        let config = PodDNSConfig {
            nameservers: Some(strings(&["10.0.0.3", "10.0.0.4"])),
            searches: Some(many.clone()),
            ..PodDNSConfig::default()
        };
        let (got, w) = pod_dns(&pod(Some("Default"), false, Some(config)), &node);
        assert_eq!(got.servers, ["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
        assert_eq!(got.searches, many[..32]);
        assert_eq!(w.len(), 2);
        assert_eq!(
            w[0].1,
            "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: 10.0.0.1 10.0.0.2 10.0.0.3"
        );
        assert!(
            w[1].1.starts_with("Search Line limits were exceeded, some search paths have been omitted, the applied search line is: d0.example d1.example ")
                && w[1].1.ends_with(" d31.example"),
            "{w:?}"
        );
        // 2,048 characters in all: 20 domains of 100 characters and their spaces fit, the
        // 21st does not.
        // A name longer than 253 characters is dropped wherever it stands.
        let mut long: Vec<String> = (0..30).map(|i| format!("{i:0>100}")).collect();
        long.insert(3, "x".repeat(254));
        let config = PodDNSConfig {
            searches: Some(long.clone()),
            ..PodDNSConfig::default()
        };
        let (got, w) = pod_dns(&pod(Some("None"), false, Some(config)), &Dns::default());
        long.remove(3);
        assert_eq!(got.searches, long[..20]);
        assert_eq!(w.len(), 1);
        // Within the limits: no warning.
        let config = PodDNSConfig {
            searches: Some(strings(&["a.example"])),
            nameservers: Some(strings(&["10.0.0.9"])),
            ..PodDNSConfig::default()
        };
        assert!(
            pod_dns(&pod(Some("Default"), false, Some(config)), &node)
                .1
                .is_empty()
        );
    }
}
