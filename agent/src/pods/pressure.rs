//! Node-pressure eviction (docs/SEEDS-SPEC.md §4.12, NODE-46..NODE-49; the kubelet's eviction
//! manager). Every [`INTERVAL`] the node's signals are compared with its hard thresholds
//! (`evictionHard`, upstream's Linux defaults unless the machine config names others): a met
//! threshold turns on the Node's pressure condition (kept [`TRANSITION_PERIOD`] after the last
//! time it was met) and evicts one pod per round, ranked as upstream ranks them (usage over
//! requests first, then lower priority, then the largest excess); critical pods are never
//! evicted. An evicted pod is `Failed` with reason `Evicted`, upstream's message and
//! `DisruptionTarget`, its containers get [`HARD_EVICTION_GRACE`]; the node records
//! `EvictionThresholdMet`. While a condition holds, node admission turns pods away as upstream's
//! eviction admission does ([`admit`]).
//!
//! Signals observed here: `memory.available` (MemFree + Inactive(file) of `/proc/meminfo`,
//! i.e. capacity − working set) and `nodefs.available` / `nodefs.inodesFree` (the ephemeral
//! storage holding writable layers, logs and pod volumes). Not yet: `imagefs.*` (images live on
//! the root file system and there is no image garbage collection), `pid.available`, soft
//! thresholds; the config refuses them rather than ignore them.
//!
//! The decisions are pure functions; [`Evictor::tick`] only measures and moves data.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Pod, Taint};
use tokio::sync::{mpsc, oneshot, watch};

use super::admission::Rejection;
use super::events;
use super::eviction::{EVICTED_REASON, PodFailure};
use super::shutdown::{Kill, Target};
use super::volumes;
use super::worker::{blocking, runtime};

/// How often the signals are compared with the thresholds (the kubelet's monitoring interval).
pub const INTERVAL: Duration = Duration::from_secs(10);
/// How long a pressure condition stays on after its threshold was last met (the kubelet's
/// `evictionPressureTransitionPeriod` default).
pub const TRANSITION_PERIOD: Duration = Duration::from_secs(300);
/// The grace period of a pod evicted at a hard threshold (upstream's
/// `immediateEvictionGracePeriodSeconds`; the runtime still gives 2 s before SIGKILL).
pub const HARD_EVICTION_GRACE: u64 = 1;

/// An eviction signal this node observes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Signal {
    MemoryAvailable,
    NodefsAvailable,
    NodefsInodesFree,
    /// The image file system (`runtime_api::IMAGE_ROOT`, a file system of its own).
    ImagefsAvailable,
    ImagefsInodesFree,
    /// Process ids: min(`kernel.pid_max`, `kernel.threads-max`) less the tasks running.
    PidAvailable,
}

impl Signal {
    pub const ALL: [Signal; 6] = [
        Signal::MemoryAvailable,
        Signal::NodefsAvailable,
        Signal::NodefsInodesFree,
        Signal::ImagefsAvailable,
        Signal::ImagefsInodesFree,
        Signal::PidAvailable,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::NodefsAvailable => "nodefs.available",
            Signal::NodefsInodesFree => "nodefs.inodesFree",
            Signal::ImagefsAvailable => "imagefs.available",
            Signal::ImagefsInodesFree => "imagefs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    /// The resource evicting pods reclaims (as upstream names it in messages and events).
    pub fn resource(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory",
            Signal::NodefsAvailable | Signal::ImagefsAvailable => "ephemeral-storage",
            Signal::NodefsInodesFree | Signal::ImagefsInodesFree => "inodes",
            Signal::PidAvailable => "pids",
        }
    }

    /// Whether the signal counts bytes (else inodes or process ids).
    fn bytes(self) -> bool {
        matches!(
            self,
            Signal::MemoryAvailable | Signal::NodefsAvailable | Signal::ImagefsAvailable
        )
    }

    fn on_imagefs(self) -> bool {
        matches!(self, Signal::ImagefsAvailable | Signal::ImagefsInodesFree)
    }
}

/// A threshold's amount: an absolute quantity (bytes, or inodes) or a share of the capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Amount {
    /// The amount, and whether it was written with a binary suffix (how messages print it).
    Quantity(u64, bool),
    /// Percent of the capacity.
    Percent(f64),
}

impl Amount {
    /// The amount for a capacity of `capacity`.
    pub fn of(self, capacity: u64) -> u64 {
        match self {
            Amount::Quantity(q, _) => q,
            Amount::Percent(p) => (capacity as f64 * p / 100.0) as u64,
        }
    }
}

/// An eviction threshold: the signal is met when what is available is below the amount.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub amount: Amount,
    /// A soft threshold's grace period: it evicts only once met this long (None: hard, it
    /// evicts at once).
    pub grace_period: Option<Duration>,
}

/// Why an `evictionHard` entry is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ThresholdError {
    #[error(
        "unsupported eviction signal {0:?} (this node observes memory.available, nodefs.available, nodefs.inodesFree, imagefs.available, imagefs.inodesFree, pid.available)"
    )]
    Signal(String),
    #[error("{signal}: {value:?} is not a quantity or a percentage between 0% and 100%")]
    Value { signal: String, value: String },
    #[error("grace period must be specified for the soft eviction threshold {0}")]
    NoGracePeriod(String),
    #[error("{signal}: invalid eviction grace period {value:?} (a duration such as 90s or 1m30s)")]
    GracePeriod { signal: String, value: String },
}

/// The node's thresholds, hard and soft.
#[derive(Debug, Clone, PartialEq)]
pub struct Thresholds(pub Vec<Threshold>);

/// The machine config's eviction settings (the kubelet's field names, as written).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EvictionConfig {
    /// `evictionHard`; None: the kubelet's defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction_hard: Option<BTreeMap<String, String>>,
    /// `evictionSoft`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub eviction_soft: BTreeMap<String, String>,
    /// `evictionSoftGracePeriod`: signal → Go duration.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub eviction_soft_grace_period: BTreeMap<String, String>,
    /// `evictionMaxPodGracePeriod`: the longest grace a pod evicted at a soft threshold gets.
    #[serde(default)]
    pub eviction_max_pod_grace_period: u64,
    /// `evictionMinimumReclaim`: signal → `<quantity>` or `<N>%`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub eviction_minimum_reclaim: BTreeMap<String, String>,
}

impl EvictionConfig {
    /// The thresholds it names (hard ones first), or why they are refused.
    /// `evictionMinimumReclaim`, checked.
    pub fn minimum_reclaim(&self) -> Result<MinimumReclaim, ThresholdError> {
        let mut out = MinimumReclaim::new();
        for (name, value) in &self.eviction_minimum_reclaim {
            let signal = signal_named(name)?;
            if let Some(amount) = parse_amount(name, value)? {
                out.insert(signal, amount);
            }
        }
        Ok(out)
    }

    pub fn thresholds(&self) -> Result<Thresholds, ThresholdError> {
        let mut t = match &self.eviction_hard {
            Some(map) => Thresholds::parse(map)?,
            None => Thresholds::default(),
        };
        for mut soft in Thresholds::parse(&self.eviction_soft)?.0 {
            let name = soft.signal.name();
            let text = self
                .eviction_soft_grace_period
                .get(name)
                .ok_or_else(|| ThresholdError::NoGracePeriod(name.into()))?;
            let grace = kcore::time::parse_go_duration(text).ok_or_else(|| ThresholdError::GracePeriod {
                signal: name.into(),
                value: text.clone(),
            })?;
            soft.grace_period = Some(grace);
            t.0.push(soft);
        }
        Ok(t)
    }
}

/// An amount as the kubelet writes one: `<quantity>` or `<N>%` (0-100). None for `0`, `0%` and
/// `100%`, which switch a threshold off.
fn parse_amount(signal: &str, value: &str) -> Result<Option<Amount>, ThresholdError> {
    let bad = || ThresholdError::Value {
        signal: signal.to_string(),
        value: value.to_string(),
    };
    if let Some(p) = value.strip_suffix('%') {
        let p: f64 = p.parse().map_err(|_| bad())?;
        if !(0.0..=100.0).contains(&p) {
            return Err(bad());
        }
        return Ok((p != 0.0 && p != 100.0).then_some(Amount::Percent(p)));
    }
    let q = kcore::quantity::bytes(value).ok_or_else(bad)?;
    Ok((q != 0).then_some(Amount::Quantity(q, kcore::quantity::is_binary(value))))
}

fn signal_named(name: &str) -> Result<Signal, ThresholdError> {
    Signal::ALL
        .into_iter()
        .find(|s| s.name() == name)
        .ok_or_else(|| ThresholdError::Signal(name.to_string()))
}

/// `evictionMinimumReclaim`: per signal, how much more than its threshold must be available
/// before a threshold met (and acting) counts as resolved.
pub type MinimumReclaim = BTreeMap<Signal, Amount>;

/// The thresholds of `previous` (those that evicted last round) still unresolved: what is
/// available is below the threshold plus its signal's minimum reclaim (upstream's
/// `thresholdsMet(..., enforceMinReclaim=true)`).
pub fn unresolved(
    previous: &[Threshold],
    min_reclaim: &MinimumReclaim,
    obs: &BTreeMap<Signal, Observation>,
) -> Vec<(Threshold, Observation)> {
    previous
        .iter()
        .filter_map(|t| {
            let o = obs.get(&t.signal)?;
            let extra = min_reclaim.get(&t.signal).map_or(0, |m| m.of(o.capacity));
            (o.available < t.amount.of(o.capacity).saturating_add(extra)).then_some((*t, *o))
        })
        .collect()
}

impl Default for Thresholds {
    /// The kubelet's Linux defaults: `memory.available<100Mi`, `nodefs.available<10%`,
    /// `nodefs.inodesFree<5%`, `imagefs.available<15%`, `imagefs.inodesFree<5%` (no
    /// `pid.available` unless configured).
    fn default() -> Self {
        Thresholds(vec![
            Threshold {
                signal: Signal::MemoryAvailable,
                amount: Amount::Quantity(kcore::allocatable::EVICTION_HARD_MEMORY, true),
                grace_period: None,
            },
            Threshold {
                signal: Signal::NodefsAvailable,
                amount: Amount::Percent(kcore::allocatable::EVICTION_HARD_NODEFS_PERCENT),
                grace_period: None,
            },
            Threshold {
                signal: Signal::NodefsInodesFree,
                amount: Amount::Percent(5.0),
                grace_period: None,
            },
            Threshold {
                signal: Signal::ImagefsAvailable,
                amount: Amount::Percent(15.0),
                grace_period: None,
            },
            Threshold {
                signal: Signal::ImagefsInodesFree,
                amount: Amount::Percent(5.0),
                grace_period: None,
            },
        ])
    }
}

impl Thresholds {
    /// The thresholds of an `evictionHard` map (signal → `<quantity>` or `<N>%`). As upstream
    /// with `mergeDefaultEvictionSettings: false`, the map replaces the defaults; `0`, `0%` and
    /// `100%` switch a signal off.
    pub fn parse(map: &BTreeMap<String, String>) -> Result<Self, ThresholdError> {
        let mut out = Vec::new();
        for (name, value) in map {
            let signal = signal_named(name)?;
            let Some(amount) = parse_amount(name, value)? else {
                continue;
            };
            out.push(Threshold {
                signal,
                amount,
                grace_period: None,
            });
        }
        Ok(Thresholds(out))
    }

    /// What the signal's hard threshold keeps back of `capacity` (0 without one): allocatable
    /// is capacity minus this (NODE-9; soft thresholds are not subtracted).
    pub fn reserved(&self, signal: Signal, capacity: u64) -> u64 {
        self.0
            .iter()
            .find(|t| t.signal == signal && t.grace_period.is_none())
            .map_or(0, |t| t.amount.of(capacity).min(capacity))
    }
}

/// What a signal observed: what is available of what capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    pub available: u64,
    pub capacity: u64,
}

/// The thresholds met by `obs`, memory first (upstream reclaims memory before disk), hard
/// before soft.
pub fn met(thresholds: &Thresholds, obs: &BTreeMap<Signal, Observation>) -> Vec<(Threshold, Observation)> {
    let mut met: Vec<(Threshold, Observation)> = thresholds
        .0
        .iter()
        .filter_map(|t| {
            let o = obs.get(&t.signal)?;
            (o.available < t.amount.of(o.capacity)).then_some((*t, *o))
        })
        .collect();
    met.sort_by_key(|(t, _)| (t.signal, t.grace_period.is_some()));
    met
}

/// The node's pressure conditions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pressure {
    pub memory: bool,
    pub disk: bool,
    pub pid: bool,
}

impl Pressure {
    /// The conditions that hold, as upstream lists them in messages.
    pub fn conditions(self) -> Vec<&'static str> {
        let mut c = Vec::new();
        if self.memory {
            c.push("MemoryPressure");
        }
        if self.disk {
            c.push("DiskPressure");
        }
        if self.pid {
            c.push("PIDPressure");
        }
        c
    }
}

/// When each condition's threshold was last met, and since when each threshold is met.
#[derive(Debug, Clone, Default)]
pub struct Tracker {
    memory: Option<SystemTime>,
    disk: Option<SystemTime>,
    pid: Option<SystemTime>,
    /// (signal, soft) → when it was first met, in the run of observations that still meets it.
    since: BTreeMap<(Signal, bool), SystemTime>,
}

impl Tracker {
    /// Records what is met at `now`; a condition holds until [`TRANSITION_PERIOD`] after its
    /// threshold was last met.
    pub fn observe(&mut self, met: &[(Threshold, Observation)], now: SystemTime) -> Pressure {
        let keys: Vec<(Signal, bool)> = met
            .iter()
            .map(|(t, _)| (t.signal, t.grace_period.is_some()))
            .collect();
        self.since.retain(|k, _| keys.contains(k));
        for k in keys {
            self.since.entry(k).or_insert(now);
        }
        for (t, _) in met {
            match t.signal {
                Signal::MemoryAvailable => self.memory = Some(now),
                Signal::PidAvailable => self.pid = Some(now),
                Signal::NodefsAvailable
                | Signal::NodefsInodesFree
                | Signal::ImagefsAvailable
                | Signal::ImagefsInodesFree => self.disk = Some(now),
            }
        }
        let holds = |at: Option<SystemTime>| {
            at.is_some_and(|at| now.duration_since(at).unwrap_or_default() < TRANSITION_PERIOD)
        };
        Pressure {
            memory: holds(self.memory),
            disk: holds(self.disk),
            pid: holds(self.pid),
        }
    }
}

impl Tracker {
    /// The met thresholds that evict at `now`: hard ones, and soft ones met for their whole
    /// grace period (upstream's `thresholdsMetGracePeriod`). Conditions do not wait for it.
    pub fn evicting(
        &self,
        met: &[(Threshold, Observation)],
        now: SystemTime,
    ) -> Vec<(Threshold, Observation)> {
        met.iter()
            .filter(|(t, _)| match t.grace_period {
                None => true,
                Some(grace) => self
                    .since
                    .get(&(t.signal, true))
                    .is_some_and(|at| now.duration_since(*at).unwrap_or_default() >= grace),
            })
            .copied()
            .collect()
    }
}

/// Eviction admission (upstream's eviction manager `Admit`): under any pressure critical pods
/// are admitted; under memory pressure alone, pods that are not BestEffort and BestEffort pods
/// tolerating the memory-pressure taint; everything else is turned away.
pub fn admit(pressure: Pressure, pod: &Pod) -> Result<(), Rejection> {
    let conditions = pressure.conditions();
    if conditions.is_empty() || kcore::qos::is_critical_pod(pod) {
        return Ok(());
    }
    if conditions == ["MemoryPressure"] {
        let best_effort = kcore::qos::pod_qos_class(pod) == kcore::qos::QosClass::BestEffort;
        let taint = Taint {
            key: "node.kubernetes.io/memory-pressure".into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        };
        let tolerates = pod
            .spec
            .iter()
            .flat_map(|s| s.tolerations.iter().flatten())
            .any(|t| kcore::taints::tolerates(t, &taint));
        if !best_effort || tolerates {
            return Ok(());
        }
    }
    Err(Rejection {
        reason: EVICTED_REASON.into(),
        message: format!("The node had condition: [{}]. ", conditions.join(" ")),
    })
}

/// A pod that may be evicted, with its containers' use of the resource being reclaimed.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub pod: Arc<Pod>,
    /// Use by container name (working set for memory; writable layer + logs for disk).
    pub containers: BTreeMap<String, u64>,
    /// Use outside the containers (disk-backed pod volumes), counted for the pod.
    pub volumes: u64,
    /// The pod's processes (its cgroup's `pids.current`), for `pid.available`.
    pub processes: u64,
}

impl Candidate {
    fn usage(&self) -> u64 {
        self.containers.values().sum::<u64>() + self.volumes
    }

    fn request(&self, signal: Signal) -> u64 {
        let Some(spec) = self.pod.spec.as_ref() else {
            return 0;
        };
        let r = kcore::resources::pod_requests(spec);
        match signal {
            Signal::MemoryAvailable => r.memory,
            Signal::NodefsAvailable | Signal::ImagefsAvailable => r.ephemeral_storage,
            Signal::NodefsInodesFree | Signal::ImagefsInodesFree | Signal::PidAvailable => 0,
        }
    }

    fn priority(&self) -> i32 {
        self.pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
    }
}

/// Ranks the candidates for `signal` (upstream's `rankMemoryPressure` / `rankDiskPressureFunc`:
/// pods using more than they request first, then lower priority, then the largest use over
/// the request; `rankPIDPressure`: lower priority, then more processes) and returns the index
/// of the first that may be evicted (critical pods never are). Inode pressure ranks by bytes
/// too (the runtime does not count inodes per pod); image file system pressure ranks as the
/// node file system's does (pods hold images only while they exist).
pub fn victim(signal: Signal, candidates: &[Candidate]) -> Option<usize> {
    let mut ranked: Vec<usize> = (0..candidates.len())
        .filter(|&i| !kcore::qos::is_critical_pod(&candidates[i].pod))
        .collect();
    if signal == Signal::PidAvailable {
        ranked.sort_by_key(|&i| {
            let c = &candidates[i];
            (c.priority(), std::cmp::Reverse(c.processes))
        });
        return ranked.first().copied();
    }
    // The key computes the pod's requests: once per candidate, not per comparison.
    ranked.sort_by_cached_key(|&i| {
        let c = &candidates[i];
        let (usage, request) = (c.usage(), c.request(signal));
        (
            usage <= request,
            c.priority(),
            std::cmp::Reverse(i128::from(usage) - i128::from(request)),
        )
    });
    ranked.first().copied()
}

/// The evicted pod's message (upstream's `evictionMessage`): the resource, the threshold and
/// what was available, then (memory and ephemeral storage only) each container using more than
/// it requests.
pub fn message(threshold: &Threshold, obs: &Observation, victim: &Candidate) -> String {
    let resource = threshold.signal.resource();
    let mut m = format!("The node was low on resource: {resource}. ");
    // Bytes print as binary quantities, inode and process counts as decimal ones (as
    // upstream's).
    let binary = threshold.signal.bytes();
    let format = |n: u64| kcore::quantity::format_bytes(n, binary);
    let quantity = match threshold.amount {
        Amount::Quantity(q, binary) => kcore::quantity::format_bytes(q, binary),
        Amount::Percent(_) => format(threshold.amount.of(obs.capacity)),
    };
    m.push_str(&format!(
        "Threshold quantity: {quantity}, available: {}. ",
        format(obs.available)
    ));
    // Upstream names containers only for the resources it measures per container.
    if !matches!(resource, "memory" | "ephemeral-storage") {
        return m;
    }
    for c in victim.pod.spec.iter().flat_map(|s| &s.containers) {
        let Some(&used) = victim.containers.get(&c.name) else {
            continue;
        };
        let request = kcore::resources::container_request(c, resource).map(|q| q.0.clone());
        let requested = request.as_deref().and_then(kcore::quantity::bytes).unwrap_or(0);
        if used > requested {
            m.push_str(&format!(
                "Container {} was using {}, request is {}, has larger consumption of {resource}. ",
                c.name,
                format(used),
                request.unwrap_or_else(|| "0".into())
            ));
        }
    }
    m
}

/// The failure an evicted pod gets: [`HARD_EVICTION_GRACE`] at a hard threshold; at a soft
/// one the smaller of `max_pod_grace` (`evictionMaxPodGracePeriod`) and the pod's own grace
/// period (NODE-47).
pub fn failure(message: String, threshold: &Threshold, pod: &Pod, max_pod_grace: u64) -> PodFailure {
    let grace = match threshold.grace_period {
        None => HARD_EVICTION_GRACE,
        Some(_) => {
            let own = pod
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
                .and_then(|g| u64::try_from(g).ok());
            own.map_or(max_pod_grace, |g| g.min(max_pod_grace))
        }
    };
    PodFailure {
        reason: EVICTED_REASON,
        message,
        grace: Some(grace),
        disruption: true,
    }
}

/// `memory.available` from `/proc/meminfo`: capacity − working set, i.e. MemFree plus the
/// inactive file cache (what the kubelet computes from cAdvisor's root cgroup).
pub fn memory_from_meminfo(meminfo: &str) -> Option<Observation> {
    let field = |name: &str| -> Option<u64> {
        let line = meminfo.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    };
    let capacity = field("MemTotal:")?;
    let available = field("MemFree:")? + field("Inactive(file):").unwrap_or(0);
    Some(Observation {
        available: available.min(capacity),
        capacity,
    })
}

/// The eviction loop's state.
#[derive(Debug)]
pub struct Evictor {
    thresholds: Thresholds,
    /// `evictionMaxPodGracePeriod`.
    max_pod_grace: u64,
    tracker: Tracker,
    /// The eviction in progress: done when the pod's containers are stopped.
    evicting: Option<oneshot::Receiver<()>>,
    /// Whether the first observation was logged.
    logged: bool,
    /// Asks image garbage collection to remove every unused image it may (answer: the bytes
    /// freed): the reclaim tried before pods are evicted for the image file system.
    images: Option<ImageReclaim>,
    min_reclaim: MinimumReclaim,
    /// The thresholds that evicted last round: they act until resolved with their minimum
    /// reclaim.
    acting: Vec<Threshold>,
}

/// A request to remove unused images now; answered with the bytes freed.
pub type ImageReclaim = mpsc::Sender<oneshot::Sender<u64>>;

impl Evictor {
    pub fn new(thresholds: Thresholds, max_pod_grace: u64, images: Option<ImageReclaim>) -> Self {
        Evictor {
            thresholds,
            max_pod_grace,
            tracker: Tracker::default(),
            evicting: None,
            logged: false,
            images,
            min_reclaim: MinimumReclaim::new(),
            acting: Vec::new(),
        }
    }

    /// With `evictionMinimumReclaim`.
    #[must_use]
    pub fn with_minimum_reclaim(mut self, min_reclaim: MinimumReclaim) -> Self {
        self.min_reclaim = min_reclaim;
        self
    }

    /// Node-level reclaim before evicting for `signal` (upstream's `reclaimNodeLevelResources`):
    /// for the image file system, unused images are removed; true when the signal's thresholds
    /// are no longer met afterwards (as `observe` then measures), so no pod needs to go.
    async fn reclaimed<F>(&self, signal: Signal, observe: F) -> bool
    where
        F: FnOnce() -> BTreeMap<Signal, Observation> + Send + 'static,
    {
        let Some(images) = self.images.as_ref().filter(|_| signal.on_imagefs()) else {
            return false;
        };
        let (tx, rx) = oneshot::channel();
        if images.send(tx).await.is_err() {
            return false;
        }
        let freed = rx.await.unwrap_or(0);
        let Some(obs) = blocking(observe).await else {
            return false;
        };
        let acting: Vec<Threshold> = self
            .thresholds
            .0
            .iter()
            .filter(|t| t.signal == signal)
            .copied()
            .collect();
        let still = !unresolved(&acting, &self.min_reclaim, &obs).is_empty();
        tracing::info!(
            signal = signal.name(),
            freed,
            still_met = still,
            "unused images removed"
        );
        !still
    }

    /// One round: measure, publish the pressure, and evict at most one of `targets` (the
    /// node's pods that have not ended), once the previous eviction is done.
    pub async fn tick(
        &mut self,
        recorder: &events::Recorder,
        targets: Vec<Target>,
        pressure: &watch::Sender<Pressure>,
    ) {
        let Some(obs) = blocking(observe).await else {
            return;
        };
        if !std::mem::replace(&mut self.logged, true) {
            let of = |s| obs.get(&s).map(|o| o.available);
            tracing::info!(
                memory_available = of(Signal::MemoryAvailable),
                nodefs_available = of(Signal::NodefsAvailable),
                nodefs_inodes_free = of(Signal::NodefsInodesFree),
                imagefs_available = of(Signal::ImagefsAvailable),
                imagefs_inodes_free = of(Signal::ImagefsInodesFree),
                pid_available = of(Signal::PidAvailable),
                pid_capacity = obs.get(&Signal::PidAvailable).map(|o| o.capacity),
                "node pressure signals"
            );
        }
        let mut met = met(&self.thresholds, &obs);
        for u in unresolved(&self.acting, &self.min_reclaim, &obs) {
            if !met.iter().any(|(t, _)| *t == u.0) {
                met.push(u);
            }
        }
        met.sort_by_key(|(t, _)| (t.signal, t.grace_period.is_some()));
        let now = SystemTime::now();
        let p = self.tracker.observe(&met, now);
        let met = self.tracker.evicting(&met, now);
        self.acting = met.iter().map(|(t, _)| *t).collect();
        pressure.send_if_modified(|old| {
            let changed = *old != p;
            if changed {
                tracing::info!(
                    memory = p.memory,
                    disk = p.disk,
                    pid = p.pid,
                    "node pressure changed"
                );
            }
            *old = p;
            changed
        });
        let Some((threshold, observation)) = met.first().copied() else {
            return;
        };
        if let Some(rx) = self.evicting.as_mut() {
            if matches!(rx.try_recv(), Err(oneshot::error::TryRecvError::Empty)) {
                return;
            }
            self.evicting = None;
        }
        let signal = threshold.signal;
        tracing::warn!(
            signal = signal.name(),
            available = observation.available,
            "eviction threshold met"
        );
        recorder
            .node_now(
                "EvictionThresholdMet",
                format!("Attempting to reclaim {}", signal.resource()),
            )
            .await;
        if self.reclaimed(signal, observe).await {
            tracing::info!(signal = signal.name(), "pressure relieved without evicting a pod");
            return;
        }
        let candidates = usage(signal, &targets).await;
        let Some(i) = victim(signal, &candidates) else {
            tracing::warn!(signal = signal.name(), "no pod may be evicted");
            return;
        };
        let v = &candidates[i];
        let msg = message(&threshold, &observation, v);
        let m = &v.pod.metadata;
        tracing::warn!(
            pod = %format!("{}/{}", m.namespace.as_deref().unwrap_or_default(), m.name.as_deref().unwrap_or_default()),
            message = %msg,
            "evicting the pod"
        );
        let ev = events::Event::pod(EVICTED_REASON, true, msg.clone());
        recorder.pod_now(&v.pod, &ev).await;
        let (tx, rx) = oneshot::channel();
        let kill = Kill {
            failure: failure(msg, &threshold, &v.pod, self.max_pod_grace),
            done: tx,
        };
        if targets[i].kill.try_send(kill).is_ok() {
            self.evicting = Some(rx);
        }
    }
}

/// The candidates (one per target, in order) with their use of what `signal` measures.
async fn usage(signal: Signal, targets: &[Target]) -> Vec<Candidate> {
    let disk = !matches!(signal, Signal::MemoryAvailable | Signal::PidAvailable);
    let uids: Vec<String> = targets
        .iter()
        .map(|t| t.pod.metadata.uid.clone().unwrap_or_default())
        .collect();
    let measured = blocking(move || {
        let mut rt = runtime().ok()?;
        let listed = rt.list_pod_stats().ok()?;
        let mut by_uid: BTreeMap<String, (BTreeMap<String, u64>, u64, u64)> = BTreeMap::new();
        for uid in &uids {
            let Some(p) = listed.iter().find(|p| &p.uid == uid) else {
                continue;
            };
            let processes = p.process_count.unwrap_or(0);
            let entry = if disk {
                let Ok(p) = rt.pod_stats(&p.sandbox_id, true) else {
                    continue;
                };
                let containers = p
                    .containers
                    .iter()
                    .map(|c| {
                        let used = c.writable_layer_bytes.unwrap_or(0) + c.logs_bytes.unwrap_or(0);
                        (c.name.clone(), used)
                    })
                    .collect();
                let dir = volumes::pod_dir(std::path::Path::new(volumes::ROOT), uid);
                (containers, kcore::summary::disk_usage(&dir), processes)
            } else {
                let containers = p
                    .containers
                    .iter()
                    .map(|c| (c.name.clone(), c.memory.working_set_bytes))
                    .collect();
                (containers, 0, processes)
            };
            by_uid.insert(uid.clone(), entry);
        }
        Some(by_uid)
    })
    .await
    .flatten()
    .unwrap_or_default();
    targets
        .iter()
        .map(|t| {
            let uid = t.pod.metadata.uid.clone().unwrap_or_default();
            let (containers, volumes, processes) = measured.get(&uid).cloned().unwrap_or_default();
            Candidate {
                pod: t.pod.clone(),
                containers,
                volumes,
                processes,
            }
        })
        .collect()
}

/// The node's signals (blocking).
fn observe() -> BTreeMap<Signal, Observation> {
    let mut obs = BTreeMap::new();
    if let Some(m) = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| memory_from_meminfo(&m))
    {
        obs.insert(Signal::MemoryAvailable, m);
    }
    for (root, bytes, inodes) in [
        (
            kcore::allocatable::EPHEMERAL_ROOT,
            Signal::NodefsAvailable,
            Signal::NodefsInodesFree,
        ),
        (
            runtime_api::IMAGE_ROOT,
            Signal::ImagefsAvailable,
            Signal::ImagefsInodesFree,
        ),
    ] {
        let Ok(st) = nix::sys::statvfs::statvfs(root) else {
            continue;
        };
        let block = st.fragment_size();
        obs.insert(
            bytes,
            Observation {
                available: st.blocks_available().saturating_mul(block),
                capacity: st.blocks().saturating_mul(block),
            },
        );
        obs.insert(
            inodes,
            Observation {
                available: st.files_available(),
                capacity: st.files(),
            },
        );
    }
    let read = |p: &str| std::fs::read_to_string(p).ok()?.trim().parse::<u64>().ok();
    if let (Some(pid_max), Ok(info)) = (read("/proc/sys/kernel/pid_max"), nix::sys::sysinfo::sysinfo()) {
        obs.insert(
            Signal::PidAvailable,
            pid_observation(
                pid_max,
                read("/proc/sys/kernel/threads-max"),
                info.process_count().into(),
            ),
        );
    }
    obs
}

/// `pid.available` as the kubelet computes it: the most process ids the node can hand out
/// (`kernel.pid_max`, bounded by `kernel.threads-max`) less the tasks running now.
pub fn pid_observation(pid_max: u64, threads_max: Option<u64>, running: u64) -> Observation {
    let capacity = threads_max.map_or(pid_max, |t| t.min(pid_max));
    Observation {
        available: capacity.saturating_sub(running),
        capacity,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI: u64 = 1 << 20;

    fn pod(name: &str, extra: serde_json::Value) -> Arc<Pod> {
        let mut p = serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {"containers": [{"name": "main"}]},
        });
        if let (Some(spec), Some(extra)) = (p["spec"].as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        Arc::new(serde_json::from_value(p).expect("pod"))
    }

    fn requesting(name: &str, memory: &str, priority: i32) -> Arc<Pod> {
        pod(
            name,
            serde_json::json!({"priority": priority, "containers": [
                {"name": "main", "resources": {"requests": {"memory": memory}}}]}),
        )
    }

    fn candidate(pod: Arc<Pod>, used: u64) -> Candidate {
        Candidate {
            pod,
            containers: [("main".to_string(), used)].into(),
            volumes: 0,
            processes: 0,
        }
    }

    #[test]
    fn thresholds_parse_as_the_kubelet_reads_them() {
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let t = Thresholds::parse(&map(&[
            ("memory.available", "600Mi"),
            ("nodefs.available", "7.5%"),
        ]))
        .expect("valid");
        assert_eq!(t.reserved(Signal::MemoryAvailable, 1024 * MI), 600 * MI);
        assert_eq!(t.reserved(Signal::NodefsAvailable, 1000), 75);
        // The map replaces the defaults: no inode threshold now.
        assert_eq!(t.reserved(Signal::NodefsInodesFree, 1000), 0);
        // 0, 0% and 100% switch a signal off.
        let off = Thresholds::parse(&map(&[
            ("memory.available", "0"),
            ("nodefs.available", "0%"),
            ("nodefs.inodesFree", "100%"),
        ]))
        .expect("valid");
        assert_eq!(off, Thresholds(vec![]));
        let d = Thresholds::default();
        assert_eq!(d.reserved(Signal::MemoryAvailable, 1024 * MI), 100 * MI);
        assert_eq!(d.reserved(Signal::NodefsAvailable, 268_435_456), 26_843_545);
        assert_eq!(d.reserved(Signal::NodefsInodesFree, 1000), 50);
        assert_eq!(d.reserved(Signal::ImagefsAvailable, 1000), 150);
        assert_eq!(d.reserved(Signal::ImagefsInodesFree, 1000), 50);
        assert_eq!(
            d.reserved(Signal::PidAvailable, 1000),
            0,
            "no pid.available by default"
        );
        let more = Thresholds::parse(&map(&[
            ("imagefs.available", "20%"),
            ("imagefs.inodesFree", "1k"),
            ("pid.available", "500"),
        ]))
        .expect("valid");
        assert_eq!(more.reserved(Signal::ImagefsAvailable, 1000), 200);
        assert_eq!(more.reserved(Signal::ImagefsInodesFree, 100_000), 1000);
        assert_eq!(more.reserved(Signal::PidAvailable, 32_768), 500);
        for (k, v) in [
            ("containerfs.available", "15%"),
            ("memory.available", "x"),
            ("nodefs.available", "101%"),
        ] {
            assert!(Thresholds::parse(&map(&[(k, v)])).is_err(), "{k}={v}");
        }
    }

    #[test]
    fn minimum_reclaim_keeps_an_acting_threshold_until_enough_is_back() {
        let t = Thresholds::default();
        let memory = t.0[0];
        let min: MinimumReclaim = [(Signal::MemoryAvailable, Amount::Quantity(50 * MI, true))].into();
        let obs = |mib: u64| -> BTreeMap<Signal, Observation> {
            [(
                Signal::MemoryAvailable,
                Observation {
                    available: mib * MI,
                    capacity: 1024 * MI,
                },
            )]
            .into()
        };
        // Threshold 100Mi: acting, it stays until 150Mi are available.
        for (mib, still) in [(90, true), (120, true), (149, true), (150, false), (400, false)] {
            assert_eq!(
                !unresolved(&[memory], &min, &obs(mib)).is_empty(),
                still,
                "{mib}Mi"
            );
        }
        // Without a minimum reclaim it resolves at the threshold itself.
        assert!(unresolved(&[memory], &MinimumReclaim::new(), &obs(100)).is_empty());
        // A threshold that was not acting is not kept.
        assert!(unresolved(&[], &min, &obs(120)).is_empty());
        // Percentages are of the capacity.
        let pct: MinimumReclaim = [(Signal::MemoryAvailable, Amount::Percent(10.0))].into();
        assert!(
            !unresolved(&[memory], &pct, &obs(200)).is_empty(),
            "100Mi + 102.4Mi"
        );
        assert!(unresolved(&[memory], &pct, &obs(203)).is_empty());
        let cfg = EvictionConfig {
            eviction_minimum_reclaim: [
                ("memory.available".to_string(), "0".to_string()),
                ("nodefs.available".to_string(), "5%".to_string()),
            ]
            .into(),
            ..EvictionConfig::default()
        };
        assert_eq!(
            cfg.minimum_reclaim().expect("valid"),
            [(Signal::NodefsAvailable, Amount::Percent(5.0))].into()
        );
    }

    #[tokio::test]
    async fn image_pressure_removes_unused_images_before_evicting() {
        let t = Thresholds::default();
        let imagefs = |available: u64| {
            move || -> BTreeMap<Signal, Observation> {
                [(
                    Signal::ImagefsAvailable,
                    Observation {
                        available,
                        capacity: 1000,
                    },
                )]
                .into()
            }
        };
        let (tx, mut requests) = mpsc::channel::<oneshot::Sender<u64>>(1);
        let gc = tokio::spawn(async move {
            let mut asked = 0;
            while let Some(answer) = requests.recv().await {
                asked += 1;
                let _ = answer.send(300);
            }
            asked
        });
        let e = Evictor::new(t.clone(), 0, Some(tx));
        // Enough freed: no eviction. Not enough: evict. Other signals do not ask.
        assert!(e.reclaimed(Signal::ImagefsAvailable, imagefs(400)).await);
        assert!(!e.reclaimed(Signal::ImagefsAvailable, imagefs(100)).await);
        assert!(!e.reclaimed(Signal::NodefsAvailable, imagefs(900)).await);
        assert!(!e.reclaimed(Signal::MemoryAvailable, imagefs(900)).await);
        drop(e);
        assert_eq!(
            gc.await.expect("gc task"),
            2,
            "asked for the two image signals only"
        );
        // Without image garbage collection there is nothing to reclaim.
        let none = Evictor::new(t, 0, None);
        assert!(!none.reclaimed(Signal::ImagefsAvailable, imagefs(900)).await);
    }

    #[test]
    fn image_and_pid_signals_set_their_conditions_and_pid_pressure_ranks_by_processes() {
        let t = Thresholds::parse(
            &[
                ("imagefs.available".to_string(), "15%".to_string()),
                ("pid.available".to_string(), "100".to_string()),
            ]
            .into(),
        )
        .expect("valid");
        let obs = |imagefs: u64, pids: u64| -> BTreeMap<Signal, Observation> {
            [
                (
                    Signal::ImagefsAvailable,
                    Observation {
                        available: imagefs,
                        capacity: 1000,
                    },
                ),
                (
                    Signal::PidAvailable,
                    pid_observation(4_194_304, Some(1000), 1000 - pids),
                ),
            ]
            .into()
        };
        let signals = |o| met(&t, &o).iter().map(|(t, _)| t.signal).collect::<Vec<_>>();
        assert!(
            signals(obs(150, 100)).is_empty(),
            "at the threshold is not below it"
        );
        assert_eq!(
            signals(obs(149, 99)),
            vec![Signal::ImagefsAvailable, Signal::PidAvailable]
        );
        let mut tr = Tracker::default();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let p = tr.observe(&met(&t, &obs(149, 500)), now);
        assert_eq!((p.memory, p.disk, p.pid), (false, true, false));
        let p = tr.observe(&met(&t, &obs(900, 10)), now);
        assert_eq!(p.conditions(), vec!["DiskPressure", "PIDPressure"]);
        // PID pressure turns every pod away but critical ones (upstream: any pressure other
        // than memory alone).
        let pid_only = Pressure {
            pid: true,
            ..Pressure::default()
        };
        let burstable = requesting("bu", "10Mi", 0);
        assert_eq!(
            admit(pid_only, &burstable).map_err(|r| r.message),
            Err("The node had condition: [PIDPressure]. ".to_string())
        );
        assert!(
            admit(
                pid_only,
                &pod("crit", serde_json::json!({"priority": 2_000_001_000}))
            )
            .is_ok()
        );
        // Ranking: lower priority first, then more processes.
        let with = |name: &str, priority: i32, processes: u64| Candidate {
            processes,
            ..candidate(requesting(name, "1Mi", priority), 0)
        };
        let cs = vec![with("few", 0, 3), with("many", 0, 40), with("important", 10, 400)];
        assert_eq!(victim(Signal::PidAvailable, &cs), Some(1));
        // The message counts processes in plain numbers.
        let th = t.0[1];
        let o = pid_observation(32_768, None, 32_700);
        let using = Candidate {
            containers: [("main".to_string(), 10 * MI)].into(),
            ..cs[1].clone()
        };
        assert_eq!(
            message(&th, &o, &using),
            "The node was low on resource: pids. Threshold quantity: 100, available: 68. "
        );
        // threads-max bounds pid_max.
        assert_eq!(pid_observation(4_194_304, Some(7_000), 100).capacity, 7_000);
        assert_eq!(pid_observation(32_768, Some(70_000), 100).available, 32_668);
    }

    #[test]
    fn a_threshold_is_met_below_its_amount_memory_first() {
        let t = Thresholds::default();
        let obs = |mem: u64, disk: u64, inodes: u64| -> BTreeMap<Signal, Observation> {
            [
                (
                    Signal::NodefsAvailable,
                    Observation {
                        available: disk,
                        capacity: 1000,
                    },
                ),
                (
                    Signal::MemoryAvailable,
                    Observation {
                        available: mem,
                        capacity: 1024 * MI,
                    },
                ),
                (
                    Signal::NodefsInodesFree,
                    Observation {
                        available: inodes,
                        capacity: 1000,
                    },
                ),
            ]
            .into()
        };
        let signals = |o| met(&t, &o).into_iter().map(|(t, _)| t.signal).collect::<Vec<_>>();
        assert_eq!(
            signals(obs(100 * MI, 100, 50)),
            vec![],
            "at the threshold is not below it"
        );
        assert_eq!(
            signals(obs(100 * MI - 1, 99, 49)),
            vec![
                Signal::MemoryAvailable,
                Signal::NodefsAvailable,
                Signal::NodefsInodesFree
            ]
        );
        assert_eq!(signals(obs(900 * MI, 99, 900)), vec![Signal::NodefsAvailable]);
        // A signal not observed (no ephemeral storage mounted) is never met.
        let only_memory: BTreeMap<Signal, Observation> = [(
            Signal::MemoryAvailable,
            Observation {
                available: 900 * MI,
                capacity: 1024 * MI,
            },
        )]
        .into();
        assert!(met(&t, &only_memory).is_empty());
    }

    #[test]
    fn conditions_hold_for_the_transition_period() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mem = Threshold {
            signal: Signal::MemoryAvailable,
            amount: Amount::Quantity(100 * MI, true),
            grace_period: None,
        };
        let o = Observation {
            available: 0,
            capacity: 1,
        };
        let mut tr = Tracker::default();
        assert_eq!(tr.observe(&[], t0), Pressure::default());
        assert_eq!(
            tr.observe(&[(mem, o)], t0),
            Pressure {
                memory: true,
                disk: false,
                pid: false,
            }
        );
        assert!(
            tr.observe(&[], t0 + TRANSITION_PERIOD - Duration::from_secs(1))
                .memory
        );
        assert!(!tr.observe(&[], t0 + TRANSITION_PERIOD).memory);
    }

    #[test]
    fn soft_thresholds_evict_after_their_grace_period() {
        let config = |soft: &[(&str, &str)], grace: &[(&str, &str)]| EvictionConfig {
            eviction_hard: Some([("memory.available".to_string(), "100Mi".to_string())].into()),
            eviction_soft: soft.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            eviction_soft_grace_period: grace
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            eviction_max_pod_grace_period: 30,
            ..EvictionConfig::default()
        };
        let t = config(&[("memory.available", "300Mi")], &[("memory.available", "1m30s")])
            .thresholds()
            .expect("valid");
        assert_eq!(t.0.len(), 2);
        assert_eq!(t.0[1].grace_period, Some(Duration::from_secs(90)));
        // Only the hard threshold is kept out of allocatable.
        assert_eq!(t.reserved(Signal::MemoryAvailable, 1024 * MI), 100 * MI);
        assert_eq!(
            config(&[("memory.available", "300Mi")], &[]).thresholds(),
            Err(ThresholdError::NoGracePeriod("memory.available".into()))
        );
        assert!(matches!(
            config(&[("memory.available", "300Mi")], &[("memory.available", "soon")]).thresholds(),
            Err(ThresholdError::GracePeriod { .. })
        ));
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let at = |s: u64| t0 + Duration::from_secs(s);
        let obs = |mem_mib: u64| -> BTreeMap<Signal, Observation> {
            [(
                Signal::MemoryAvailable,
                Observation {
                    available: mem_mib * MI,
                    capacity: 1024 * MI,
                },
            )]
            .into()
        };
        let softness = |e: &[(Threshold, Observation)]| {
            e.iter()
                .map(|(t, _)| t.grace_period.is_some())
                .collect::<Vec<_>>()
        };
        let mut tr = Tracker::default();
        // Below the soft threshold only: the condition at once, the eviction after 90 s.
        let m = met(&t, &obs(200));
        assert_eq!(
            tr.observe(&m, at(0)),
            Pressure {
                memory: true,
                disk: false,
                pid: false,
            }
        );
        assert!(tr.evicting(&m, at(0)).is_empty());
        tr.observe(&m, at(60));
        assert!(tr.evicting(&m, at(60)).is_empty());
        tr.observe(&m, at(90));
        assert_eq!(softness(&tr.evicting(&m, at(90))), vec![true]);
        // Recovered, then met again: the grace period starts over.
        tr.observe(&met(&t, &obs(500)), at(100));
        let m = met(&t, &obs(200));
        tr.observe(&m, at(110));
        assert!(tr.evicting(&m, at(150)).is_empty());
        // Below the hard one too: hard first, at once.
        let m = met(&t, &obs(50));
        tr.observe(&m, at(160));
        assert_eq!(softness(&tr.evicting(&m, at(160))), vec![false]);
    }

    #[test]
    fn admission_under_pressure_is_upstreams() {
        let best_effort = pod("be", serde_json::json!({}));
        let burstable = requesting("bu", "10Mi", 0);
        let tolerating = pod(
            "tol",
            serde_json::json!({"tolerations": [{"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"}]}),
        );
        let critical = pod("crit", serde_json::json!({"priority": 2_000_001_000}));
        let memory = Pressure {
            memory: true,
            disk: false,
            pid: false,
        };
        let disk = Pressure {
            memory: false,
            disk: true,
            pid: false,
        };
        let both = Pressure {
            memory: true,
            disk: true,
            pid: false,
        };
        let verdict = |p: Pressure, pod: &Pod| admit(p, pod).map_err(|r| (r.reason, r.message));
        for p in [&best_effort, &burstable, &tolerating, &critical] {
            assert_eq!(verdict(Pressure::default(), p), Ok(()));
            assert_eq!(verdict(both, &critical), Ok(()));
        }
        assert_eq!(
            verdict(memory, &best_effort),
            Err((
                "Evicted".into(),
                "The node had condition: [MemoryPressure]. ".into()
            ))
        );
        assert_eq!(verdict(memory, &burstable), Ok(()));
        assert_eq!(verdict(memory, &tolerating), Ok(()));
        assert_eq!(
            verdict(disk, &burstable),
            Err((
                "Evicted".into(),
                "The node had condition: [DiskPressure]. ".into()
            ))
        );
        assert_eq!(
            verdict(both, &tolerating),
            Err((
                "Evicted".into(),
                "The node had condition: [MemoryPressure DiskPressure]. ".into()
            ))
        );
    }

    #[test]
    fn victims_rank_by_excess_then_priority_then_size() {
        let name = |cs: &[Candidate], s: Signal| {
            victim(s, cs).map(|i| cs[i].pod.metadata.name.clone().unwrap_or_default())
        };
        let m = Signal::MemoryAvailable;
        // Over its request beats a bigger pod within its request.
        let cs = [
            candidate(requesting("within", "500Mi", 0), 400 * MI),
            candidate(requesting("over", "10Mi", 0), 20 * MI),
        ];
        assert_eq!(name(&cs, m).as_deref(), Some("over"));
        // Among pods over their requests, the lower priority first, even if smaller.
        let cs = [
            candidate(requesting("high", "0", 1000), 300 * MI),
            candidate(requesting("low", "0", 10), 5 * MI),
        ];
        assert_eq!(name(&cs, m).as_deref(), Some("low"));
        // Same priority: the largest excess over the request.
        let cs = [
            candidate(requesting("a", "100Mi", 0), 150 * MI),
            candidate(requesting("b", "10Mi", 0), 100 * MI),
            candidate(requesting("c", "0", 0), 60 * MI),
        ];
        assert_eq!(name(&cs, m).as_deref(), Some("b"));
        // Critical pods are never evicted, however big.
        let cs = [candidate(
            pod("crit", serde_json::json!({"priority": 2_000_000_000})),
            900 * MI,
        )];
        assert_eq!(name(&cs, m), None);
        // Disk ranks by writable layer + logs + volumes against ephemeral-storage requests.
        let mut vol = candidate(pod("vol", serde_json::json!({})), MI);
        vol.volumes = 50 * MI;
        let cs = [candidate(pod("logs", serde_json::json!({})), 20 * MI), vol];
        assert_eq!(name(&cs, Signal::NodefsAvailable).as_deref(), Some("vol"));
    }

    #[test]
    fn eviction_messages_are_upstreams() {
        let t = Threshold {
            signal: Signal::MemoryAvailable,
            amount: Amount::Quantity(600 * MI, true),
            grace_period: None,
        };
        let o = Observation {
            available: 512_001 * 1024,
            capacity: 1024 * MI,
        };
        let p = pod(
            "hog",
            serde_json::json!({"containers": [
                {"name": "eat", "resources": {"requests": {"memory": "64Mi"}}},
                {"name": "small", "resources": {"requests": {"memory": "64Mi"}}},
                {"name": "none"}]}),
        );
        let c = Candidate {
            pod: p,
            containers: [
                ("eat".to_string(), 300 * MI),
                ("small".to_string(), MI),
                ("none".to_string(), 4096 * 1024 + 512),
            ]
            .into(),
            volumes: 0,
            processes: 0,
        };
        assert_eq!(
            message(&t, &o, &c),
            "The node was low on resource: memory. Threshold quantity: 600Mi, available: 512001Ki. \
             Container eat was using 300Mi, request is 64Mi, has larger consumption of memory. \
             Container none was using 4194816, request is 0, has larger consumption of memory. "
        );
        let f = failure(message(&t, &o, &c), &t, &c.pod, 30);
        assert_eq!((f.reason, f.grace, f.disruption), ("Evicted", Some(1), true));
        // At a soft threshold: the smaller of evictionMaxPodGracePeriod and the pod's own.
        let soft = Threshold {
            grace_period: Some(Duration::from_secs(60)),
            ..t
        };
        let own = |g: i64| pod("p", serde_json::json!({"terminationGracePeriodSeconds": g}));
        assert_eq!(failure(String::new(), &soft, &own(10), 30).grace, Some(10));
        assert_eq!(failure(String::new(), &soft, &own(45), 30).grace, Some(30));
        assert_eq!(
            failure(String::new(), &soft, &pod("p", serde_json::json!({})), 0).grace,
            Some(0)
        );
        // A percentage threshold prints the quantity it stands for.
        let disk = Threshold {
            signal: Signal::NodefsAvailable,
            amount: Amount::Percent(10.0),
            grace_period: None,
        };
        let d = Observation {
            available: 20 * MI,
            capacity: 256 * MI,
        };
        let none = Candidate {
            pod: pod("p", serde_json::json!({})),
            containers: BTreeMap::new(),
            volumes: 0,
            processes: 0,
        };
        assert_eq!(
            message(&disk, &d, &none),
            "The node was low on resource: ephemeral-storage. Threshold quantity: 26843545, available: 20Mi. "
        );
    }

    #[test]
    fn memory_available_is_free_plus_inactive_file() {
        let meminfo = "MemTotal:        1012000 kB\nMemFree:          500000 kB\nMemAvailable:     800000 kB\nInactive(file):   100000 kB\n";
        assert_eq!(
            memory_from_meminfo(meminfo),
            Some(Observation {
                available: 600_000 * 1024,
                capacity: 1_012_000 * 1024
            })
        );
        assert_eq!(memory_from_meminfo("MemFree: 1 kB\n"), None);
    }
}
