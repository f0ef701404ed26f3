//! Capacity gauges, computed when Prometheus scrapes (never per scheduling request): devices by
//! type and state, GPU memory and core used vs total, and GPU memory stranded on partly used
//! GPUs, cluster-wide; the same per node only with `--per-node-metrics` (one series set per node
//! is a cardinality cost on big clusters).
//!
//! The numbers come from [`crate::cluster::report`], the same view `inspect` prints, so the dashboard and
//! the CLI cannot disagree. This module registers a collector; it never mutates the caches.

use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntGauge, IntGaugeVec, Opts};

use crate::cluster::ClusterState;
use crate::cluster::report::{self, DeviceState, NodeReport, StateCounts};
use crate::metrics::Metrics;

/// The device states exported, in label order.
const STATES: [DeviceState; 4] = [
    DeviceState::WholeFree,
    DeviceState::PartlyUsed,
    DeviceState::Full,
    DeviceState::Unhealthy,
];

fn by_state(c: &StateCounts, s: DeviceState) -> i64 {
    let n = match s {
        DeviceState::WholeFree => c.whole_free,
        DeviceState::PartlyUsed => c.partly_used,
        DeviceState::Full => c.full,
        DeviceState::Unhealthy => c.unhealthy,
        DeviceState::Absent => 0,
    };
    i64::try_from(n).unwrap_or(i64::MAX)
}

struct Gauges {
    devices: IntGaugeVec,
    memory_used: IntGaugeVec,
    memory_total: IntGaugeVec,
    core_used: IntGaugeVec,
    core_total: IntGaugeVec,
    fragmented: IntGaugeVec,
    unknown_holders: IntGaugeVec,
}

impl Gauges {
    /// `node` adds a `node` label (the per-node families).
    fn new(prefix: &str, node: bool) -> Result<Self, prometheus::Error> {
        let labels = |extra: &[&'static str]| -> Vec<&'static str> {
            let mut l: Vec<&'static str> = if node { vec!["node"] } else { vec![] };
            l.extend_from_slice(extra);
            l
        };
        let scope = if node { "per node" } else { "cluster-wide" };
        let g = |name: &str, help: &str, extra: &[&'static str]| {
            IntGaugeVec::new(
                Opts::new(format!("{prefix}{name}"), format!("{help} ({scope}).")),
                &labels(extra),
            )
        };
        Ok(Gauges {
            devices: g(
                "devices",
                "Devices by type (gpu, rdma, fpga) and state (whole_free, partly_used, full, unhealthy)",
                &["type", "state"],
            )?,
            memory_used: g(
                "gpu_memory_used_bytes",
                "GPU memory allocated on healthy GPUs",
                &[],
            )?,
            memory_total: g("gpu_memory_total_bytes", "GPU memory of healthy GPUs", &[])?,
            core_used: g(
                "gpu_core_used_percent",
                "GPU compute allocated on healthy GPUs, in percent of one GPU",
                &[],
            )?,
            core_total: g(
                "gpu_core_total_percent",
                "GPU compute of healthy GPUs, in percent of one GPU",
                &[],
            )?,
            fragmented: g(
                "gpu_memory_fragmented_bytes",
                "GPU memory still free on partly used GPUs (only shared requests can use it)",
                &[],
            )?,
            unknown_holders: g(
                "device_holders_unknown_identity",
                "Bound pods asking for managed devices without a device-allocated annotation, counted as holding devices of unknown identity",
                &[],
            )?,
        })
    }

    fn all(&self) -> [&IntGaugeVec; 7] {
        [
            &self.devices,
            &self.memory_used,
            &self.memory_total,
            &self.core_used,
            &self.core_total,
            &self.fragmented,
            &self.unknown_holders,
        ]
    }

    fn reset(&self) {
        for g in self.all() {
            g.reset();
        }
    }

    fn set(&self, node: Option<&str>, summary: &report::Summary) {
        let with = |g: &IntGaugeVec, extra: &[&str]| -> IntGauge {
            let mut l: Vec<&str> = node.into_iter().collect();
            l.extend_from_slice(extra);
            g.with_label_values(&l)
        };
        for (t, counts) in [
            ("gpu", &summary.gpus),
            ("rdma", &summary.rdma),
            ("fpga", &summary.fpga),
        ] {
            for s in STATES {
                with(&self.devices, &[t, s.as_str()]).set(by_state(counts, s));
            }
        }
        with(&self.memory_used, &[]).set(summary.gpu_memory_bytes.used);
        with(&self.memory_total, &[]).set(summary.gpu_memory_bytes.total);
        with(&self.core_used, &[]).set(summary.gpu_core_percent.used);
        with(&self.core_total, &[]).set(summary.gpu_core_percent.total);
        with(&self.fragmented, &[]).set(summary.fragmentation_bytes);
        with(&self.unknown_holders, &[])
            .set(i64::try_from(summary.unknown_identity_holders).unwrap_or(i64::MAX));
    }
}

/// The collector: walks the caches on every scrape.
pub struct CapacityCollector {
    cluster: Arc<ClusterState>,
    cluster_gauges: Gauges,
    node_gauges: Option<Gauges>,
    descs: Vec<Desc>,
    /// Two concurrent scrapes must not interleave their reset-then-set of the shared gauges.
    collecting: parking_lot::Mutex<()>,
}

impl CapacityCollector {
    pub fn new(cluster: Arc<ClusterState>, per_node: bool) -> Result<Self, prometheus::Error> {
        let cluster_gauges = Gauges::new("", false)?;
        let node_gauges = per_node.then(|| Gauges::new("node_", true)).transpose()?;
        let descs = cluster_gauges
            .all()
            .into_iter()
            .chain(node_gauges.iter().flat_map(|g| g.all()))
            .flat_map(|g| g.desc().into_iter().cloned())
            .collect();
        Ok(CapacityCollector {
            cluster,
            cluster_gauges,
            node_gauges,
            descs,
            collecting: parking_lot::Mutex::new(()),
        })
    }
}

impl Collector for CapacityCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let _one_at_a_time = self.collecting.lock();
        let nodes: Vec<NodeReport> = report::cluster_report(&self.cluster, &[]).nodes;
        self.cluster_gauges.reset();
        self.cluster_gauges.set(None, &report::summarize(&nodes));
        let mut out: Vec<MetricFamily> = self
            .cluster_gauges
            .all()
            .into_iter()
            .flat_map(|g| g.collect())
            .collect();
        if let Some(per_node) = &self.node_gauges {
            // Reset first: a node that left the cluster must not keep its last values.
            per_node.reset();
            for n in &nodes {
                per_node.set(Some(&n.name), &report::summarize(std::iter::once(n)));
            }
            out.extend(per_node.all().into_iter().flat_map(|g| g.collect()));
        }
        out
    }
}

/// Registers the capacity collector on the service's registry.
pub fn register(
    metrics: &Metrics,
    cluster: Arc<ClusterState>,
    per_node: bool,
) -> Result<(), prometheus::Error> {
    metrics
        .registry
        .register(Box::new(CapacityCollector::new(cluster, per_node)?))
}
