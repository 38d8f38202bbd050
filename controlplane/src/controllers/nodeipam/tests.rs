//! Table tests of pod CIDR allocation.

use super::reconcile::{Allocator, Cidr, IpamConfig, IpamError};

fn cluster() -> Allocator {
    let c = IpamConfig::default();
    Allocator::new(c.cluster_cidr, c.node_mask).expect("allocator")
}

#[test]
fn each_node_gets_its_own_slash_24_of_10_244() {
    let mut a = cluster();
    assert_eq!(a.allocate("n1").expect("cidr").to_string(), "10.244.0.0/24");
    assert_eq!(a.allocate("n2").expect("cidr").to_string(), "10.244.1.0/24");
    assert_eq!(
        a.allocate("n1").expect("cidr").to_string(),
        "10.244.0.0/24",
        "asked again: the same"
    );
    assert_eq!(a.used(), 2);
}

#[test]
fn existing_cidrs_are_occupied_and_never_handed_out_twice() {
    let mut a = cluster();
    a.occupy("old", "10.244.0.0/24").expect("occupy");
    a.occupy("older", "10.244.2.0/24").expect("occupy");
    assert_eq!(a.allocate("new").expect("cidr").to_string(), "10.244.1.0/24");
    assert_eq!(a.allocate("newer").expect("cidr").to_string(), "10.244.3.0/24");
    assert_eq!(
        a.occupy("intruder", "10.244.2.0/24"),
        Err(IpamError::Taken {
            cidr: "10.244.2.0/24".parse().expect("cidr"),
            holder: "older".into()
        })
    );
    assert!(matches!(
        a.occupy("x", "192.168.0.0/24"),
        Err(IpamError::OutOfRange { .. })
    ));
    assert!(matches!(
        a.occupy("x", "10.244.0.0/25"),
        Err(IpamError::OutOfRange { .. })
    ));
}

#[test]
fn a_released_cidr_comes_back_only_after_the_others() {
    let c: Cidr = "10.0.0.0/30".parse().expect("cidr");
    let mut a = Allocator::new(c, 32).expect("allocator");
    let first = a.allocate("a").expect("cidr");
    a.allocate("b").expect("cidr");
    assert_eq!(a.release("a"), Some(first));
    assert_eq!(a.allocate("c").expect("cidr").to_string(), "10.0.0.2/32");
    assert_eq!(a.allocate("d").expect("cidr").to_string(), "10.0.0.3/32");
    assert_eq!(
        a.allocate("e").expect("cidr"),
        first,
        "wrapped around to the freed one"
    );
    assert_eq!(a.allocate("f"), Err(IpamError::Exhausted(c)));
    assert!(
        Allocator::new(c, 29).is_err(),
        "a node mask wider than the cluster"
    );
    assert_eq!(
        "10.244.7.9/16".parse::<Cidr>().expect("cidr").to_string(),
        "10.244.0.0/16"
    );
}
