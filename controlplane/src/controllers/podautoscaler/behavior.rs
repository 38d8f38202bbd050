//! From the metrics' proposal to the replica count to set (docs/SEEDS-SPEC.md CTL-51, CTL-52;
//! upstream `normalizeDesiredReplicas` and `normalizeDesiredReplicasWithBehaviors`): the
//! recommendations of the stabilization windows, the scaling policies over the history of the
//! controller's own scale changes, and the min/max clamps, each with the `AbleToScale` and
//! `ScalingLimited` reasons upstream gives. The history lives in memory, per HPA.

use chrono::{DateTime, Duration, Utc};
use k8s_openapi::api::autoscaling::v2::{HPAScalingRules, HorizontalPodAutoscalerBehavior};

/// Upstream's `--horizontal-pod-autoscaler-downscale-stabilization`: the scale-down window
/// without `behavior`, and with a `behavior.scaleDown` that does not set one.
pub const DOWNSCALE_STABILIZATION_WINDOW: i32 = 300;

/// Without `behavior`, one pass grows to at most `max(2 × current, 4)`.
const SCALE_UP_LIMIT_FACTOR: f64 = 2.0;
const SCALE_UP_LIMIT_MINIMUM: f64 = 4.0;

/// A replica count the metrics proposed, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recommendation {
    pub replicas: i32,
    pub at: DateTime<Utc>,
}

/// A scale change this controller made (replicas added or removed), and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScaleEvent {
    pub change: i32,
    pub at: DateTime<Utc>,
    pub outdated: bool,
}

/// What the controller remembers of one HPA between passes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    pub recommendations: Vec<Recommendation>,
    pub scale_ups: Vec<ScaleEvent>,
    pub scale_downs: Vec<ScaleEvent>,
}

/// A condition's reason and message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reason {
    pub reason: &'static str,
    pub message: &'static str,
}

const READY_FOR_NEW_SCALE: Reason = Reason {
    reason: "ReadyForNewScale",
    message: "recommended size matches current size",
};
const SCALE_UP_STABILIZED: Reason = Reason {
    reason: "ScaleUpStabilized",
    message: "recent recommendations were lower than current one, applying the lowest recent recommendation",
};
const SCALE_DOWN_STABILIZED: Reason = Reason {
    reason: "ScaleDownStabilized",
    message: "recent recommendations were higher than current one, applying the highest recent recommendation",
};
const SCALE_UP_LIMIT: Reason = Reason {
    reason: "ScaleUpLimit",
    message: "the desired replica count is increasing faster than the maximum scale rate",
};
const SCALE_DOWN_LIMIT: Reason = Reason {
    reason: "ScaleDownLimit",
    message: "the desired replica count is decreasing faster than the maximum scale rate",
};
const TOO_MANY_REPLICAS: Reason = Reason {
    reason: "TooManyReplicas",
    message: "the desired replica count is more than the maximum replica count",
};
const TOO_FEW_REPLICAS: Reason = Reason {
    reason: "TooFewReplicas",
    message: "the desired replica count is less than the minimum replica count",
};
const DESIRED_WITHIN_RANGE: Reason = Reason {
    reason: "DesiredWithinRange",
    message: "the desired count is within the acceptable range",
};

/// The replica count to set, with the `AbleToScale` (status True) and `ScalingLimited`
/// conditions that explain it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Normalized {
    pub replicas: i32,
    pub able_to_scale: Reason,
    /// `ScalingLimited`'s status: the clamps or rates changed the stabilized count.
    pub limited: bool,
    pub scaling_limited: Reason,
}

/// How a policy's proposals are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Select {
    Max,
    Min,
    Disabled,
}

/// One policy: `Pods` (a count) or `Percent`, over `period` seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub percent: bool,
    pub value: i32,
    pub period: i32,
}

/// One direction's rules with the API's defaults filled in (upstream
/// `GenerateHPAScaleUpRules`/`GenerateHPAScaleDownRules`, and the controller's own scale-down
/// window when none is set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    pub window: i32,
    pub select: Select,
    pub policies: Vec<Policy>,
}

fn rules(given: Option<&HPAScalingRules>, window: i32, policies: &[Policy]) -> Rules {
    let select = match given.and_then(|r| r.select_policy.as_deref()) {
        Some("Min") => Select::Min,
        Some("Disabled") => Select::Disabled,
        _ => Select::Max,
    };
    let policies = match given.and_then(|r| r.policies.as_ref()) {
        Some(ps) => ps
            .iter()
            .map(|p| Policy {
                percent: p.type_ == "Percent",
                value: p.value,
                period: p.period_seconds,
            })
            .collect(),
        None => policies.to_vec(),
    };
    Rules {
        window: given
            .and_then(|r| r.stabilization_window_seconds)
            .unwrap_or(window),
        select,
        policies,
    }
}

/// Scale-up rules: by default 4 pods or 100 % per 15 s, whichever is more, no window
/// (docs/SEEDS-SPEC.md CTL-52: 15 s).
pub fn scale_up_rules(b: &HorizontalPodAutoscalerBehavior) -> Rules {
    let defaults = [
        Policy {
            percent: false,
            value: 4,
            period: 15,
        },
        Policy {
            percent: true,
            value: 100,
            period: 15,
        },
    ];
    rules(b.scale_up.as_ref(), 0, &defaults)
}

/// Scale-down rules: by default 100 % per 15 s over a 300 s window.
pub fn scale_down_rules(b: &HorizontalPodAutoscalerBehavior) -> Rules {
    let defaults = [Policy {
        percent: true,
        value: 100,
        period: 15,
    }];
    rules(b.scale_down.as_ref(), DOWNSCALE_STABILIZATION_WINDOW, &defaults)
}

impl History {
    /// The first pass over an HPA recommends its current count (upstream's
    /// `recordInitialRecommendation`).
    pub fn record_initial(&mut self, current: i32, now: DateTime<Utc>) {
        if self.recommendations.is_empty() {
            self.recommendations.push(Recommendation {
                replicas: current,
                at: now,
            });
        }
    }

    /// Stores `desired` in place of one recommendation older than `cutoff`, or adds it.
    fn remember(&mut self, desired: i32, old: Option<usize>, now: DateTime<Utc>) {
        let rec = Recommendation {
            replicas: desired,
            at: now,
        };
        match old.and_then(|i| self.recommendations.get_mut(i)) {
            Some(slot) => *slot = rec,
            None => self.recommendations.push(rec),
        }
    }

    /// Without `behavior`: the highest recommendation of the last `window` seconds (upstream's
    /// `stabilizeRecommendation`).
    fn stabilize_down(&mut self, desired: i32, window: i32, now: DateTime<Utc>) -> i32 {
        let cutoff = now - Duration::seconds(i64::from(window));
        let mut max = desired;
        let mut old = None;
        for (i, r) in self.recommendations.iter().enumerate() {
            if r.at < cutoff {
                old = Some(i);
            } else if r.replicas > max {
                max = r.replicas;
            }
        }
        self.remember(desired, old, now);
        max
    }

    /// With `behavior`: the current count brought within [lowest recommendation of the
    /// scale-up window, highest of the scale-down window] (upstream's
    /// `stabilizeRecommendationWithBehaviors`).
    fn stabilize(
        &mut self,
        desired: i32,
        current: i32,
        up: &Rules,
        down: &Rules,
        now: DateTime<Utc>,
    ) -> (i32, Reason) {
        let up_cutoff = now - Duration::seconds(i64::from(up.window));
        let down_cutoff = now - Duration::seconds(i64::from(down.window));
        let (mut up_rec, mut down_rec) = (desired, desired);
        let mut old = None;
        for (i, r) in self.recommendations.iter().enumerate() {
            if r.at > up_cutoff {
                up_rec = up_rec.min(r.replicas);
            }
            if r.at > down_cutoff {
                down_rec = down_rec.max(r.replicas);
            }
            if r.at < up_cutoff && r.at < down_cutoff {
                old = Some(i);
            }
        }
        let stabilized = current.max(up_rec).min(down_rec);
        self.remember(desired, old, now);
        let reason = if desired >= current {
            SCALE_UP_STABILIZED
        } else {
            SCALE_DOWN_STABILIZED
        };
        (stabilized, reason)
    }

    /// Remembers a scale change made with `behavior` (upstream's `storeScaleEvent`: an event
    /// older than the direction's longest policy period is replaced).
    pub fn store_scale_event(
        &mut self,
        behavior: Option<&HorizontalPodAutoscalerBehavior>,
        previous: i32,
        new: i32,
        now: DateTime<Utc>,
    ) {
        let Some(b) = behavior else { return };
        let (events, rules, change) = if new > previous {
            (&mut self.scale_ups, scale_up_rules(b), new - previous)
        } else {
            (&mut self.scale_downs, scale_down_rules(b), previous - new)
        };
        let longest = rules.policies.iter().map(|p| p.period).max().unwrap_or(0);
        let cutoff = now - Duration::seconds(i64::from(longest));
        let mut old = None;
        for (i, e) in events.iter_mut().enumerate() {
            if e.at < cutoff {
                e.outdated = true;
            }
            if e.outdated {
                old = Some(i);
            }
        }
        let event = ScaleEvent {
            change,
            at: now,
            outdated: false,
        };
        match old.and_then(|i| events.get_mut(i)) {
            Some(slot) => *slot = event,
            None => events.push(event),
        }
    }
}

/// Replicas changed by the events of the last `period` seconds.
fn changed_within(period: i32, events: &[ScaleEvent], now: DateTime<Utc>) -> i32 {
    let cutoff = now - Duration::seconds(i64::from(period));
    events
        .iter()
        .filter(|e| e.at > cutoff)
        .map(|e| e.change)
        .fold(0, i32::saturating_add)
}

/// The count at the start of a policy's period: now, less what was added, plus what was removed.
fn period_start(current: i32, period: i32, h: &History, now: DateTime<Utc>) -> i32 {
    current - changed_within(period, &h.scale_ups, now) + changed_within(period, &h.scale_downs, now)
}

/// The most replicas the scale-up policies allow now (upstream's
/// `calculateScaleUpLimitWithScalingRules`).
pub fn scale_up_limit(current: i32, h: &History, r: &Rules, now: DateTime<Utc>) -> i32 {
    let pick: fn(i32, i32) -> i32 = match r.select {
        Select::Disabled => return current,
        Select::Min => i32::min,
        Select::Max => i32::max,
    };
    let mut result = if r.select == Select::Min {
        i32::MAX
    } else {
        i32::MIN
    };
    for p in &r.policies {
        let start = period_start(current, p.period, h, now);
        let proposed = if p.percent {
            // Rounded up, or a small target would never grow.
            let v = (f64::from(start) * (1.0 + f64::from(p.value) / 100.0)).ceil();
            saturate(v)
        } else {
            start.saturating_add(p.value)
        };
        result = pick(result, proposed);
    }
    result
}

/// The fewest replicas the scale-down policies allow now (upstream's
/// `calculateScaleDownLimitWithBehaviors`).
pub fn scale_down_limit(current: i32, h: &History, r: &Rules, now: DateTime<Utc>) -> i32 {
    let pick: fn(i32, i32) -> i32 = match r.select {
        Select::Disabled => return current,
        Select::Min => i32::max,
        Select::Max => i32::min,
    };
    let mut result = if r.select == Select::Min {
        i32::MIN
    } else {
        i32::MAX
    };
    for p in &r.policies {
        let start = period_start(current, p.period, h, now);
        let proposed = if p.percent {
            // Truncated, as upstream's int32 conversion does.
            saturate((f64::from(start) * (1.0 - f64::from(p.value) / 100.0)).trunc())
        } else {
            start.saturating_sub(p.value)
        };
        result = pick(result, proposed);
    }
    result
}

fn saturate(v: f64) -> i32 {
    if v >= f64::from(i32::MAX) {
        i32::MAX
    } else if v <= f64::from(i32::MIN) {
        i32::MIN
    } else {
        v as i32
    }
}

/// The count to set for the metrics' proposal `desired` (stabilized, rate-limited, clamped to
/// [`min`, `max`]); records `desired` in the history.
pub fn normalize(
    h: &mut History,
    behavior: Option<&HorizontalPodAutoscalerBehavior>,
    current: i32,
    desired: i32,
    min: i32,
    max: i32,
    now: DateTime<Utc>,
) -> Normalized {
    let Some(b) = behavior else {
        return normalize_legacy(h, current, desired, min, max, now);
    };
    let (up, down) = (scale_up_rules(b), scale_down_rules(b));
    let (stabilized, stabilized_reason) = h.stabilize(desired, current, &up, &down, now);
    let able_to_scale = if stabilized != desired {
        stabilized_reason
    } else {
        READY_FOR_NEW_SCALE
    };
    let (replicas, scaling_limited) = if stabilized > current {
        let limit = scale_up_limit(current, h, &up, now).max(current);
        let (allowed, why) = if max > limit {
            (limit, SCALE_UP_LIMIT)
        } else {
            (max, TOO_MANY_REPLICAS)
        };
        if stabilized > allowed {
            (allowed, why)
        } else {
            (stabilized, DESIRED_WITHIN_RANGE)
        }
    } else if stabilized < current {
        let limit = scale_down_limit(current, h, &down, now).min(current);
        let (allowed, why) = if min < limit {
            (limit, SCALE_DOWN_LIMIT)
        } else {
            (min, TOO_FEW_REPLICAS)
        };
        if stabilized < allowed {
            (allowed, why)
        } else {
            (stabilized, DESIRED_WITHIN_RANGE)
        }
    } else {
        (stabilized, DESIRED_WITHIN_RANGE)
    };
    Normalized {
        replicas,
        able_to_scale,
        limited: replicas != stabilized,
        scaling_limited,
    }
}

/// Without `behavior`: the scale-down window, then growth to at most `max(2 × current, 4)`
/// (upstream's `normalizeDesiredReplicas` and `convertDesiredReplicasWithRules`).
fn normalize_legacy(
    h: &mut History,
    current: i32,
    desired: i32,
    min: i32,
    max: i32,
    now: DateTime<Utc>,
) -> Normalized {
    let stabilized = h.stabilize_down(desired, DOWNSCALE_STABILIZATION_WINDOW, now);
    let able_to_scale = if stabilized != desired {
        SCALE_DOWN_STABILIZED
    } else {
        READY_FOR_NEW_SCALE
    };
    let limit = saturate((SCALE_UP_LIMIT_FACTOR * f64::from(current)).max(SCALE_UP_LIMIT_MINIMUM));
    let (allowed_max, why) = if max > limit {
        (limit, SCALE_UP_LIMIT)
    } else {
        (max, TOO_MANY_REPLICAS)
    };
    let (replicas, scaling_limited) = if stabilized < min {
        (min, TOO_FEW_REPLICAS)
    } else if stabilized > allowed_max {
        (allowed_max, why)
    } else {
        (stabilized, DESIRED_WITHIN_RANGE)
    };
    Normalized {
        replicas,
        able_to_scale,
        limited: replicas != stabilized,
        scaling_limited,
    }
}
