package kubeletplugin

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the kubelet plugin's collectors. They are registered on the
// registry passed to NewMetrics, never on a global one.
type Metrics struct {
	PrepareDuration   prometheus.Histogram
	UnprepareDuration prometheus.Histogram
	PrepareErrors     prometheus.Counter
	PreparedClaims    prometheus.Gauge
	PreparedDevices   prometheus.Gauge
	PublishedDevices  prometheus.Gauge
	UnhealthyDevices  prometheus.Gauge
	SkippedDevices    *prometheus.GaugeVec
}

// latencyBuckets start at 0.5 ms: a prepare that only writes a CDI spec and
// a checkpoint takes about a millisecond.
var latencyBuckets = prometheus.ExponentialBuckets(0.0005, 2, 14)

// NewMetrics creates the collectors and registers them on reg (nil skips
// registration, for tests that do not read metrics).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		PrepareDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "gputopo", Subsystem: "plugin", Name: "prepare_duration_seconds",
			Help: "Time to prepare one ResourceClaim (CDI spec and checkpoint).", Buckets: latencyBuckets,
		}),
		UnprepareDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "gputopo", Subsystem: "plugin", Name: "unprepare_duration_seconds",
			Help: "Time to unprepare one ResourceClaim.", Buckets: latencyBuckets,
		}),
		PrepareErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "gputopo", Subsystem: "plugin", Name: "prepare_errors_total",
			Help: "ResourceClaims whose preparation failed.",
		}),
		PreparedClaims: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "gputopo", Subsystem: "plugin", Name: "prepared_claims",
			Help: "ResourceClaims currently prepared on this node.",
		}),
		PreparedDevices: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "gputopo", Subsystem: "plugin", Name: "prepared_devices",
			Help: "GPUs currently prepared for a ResourceClaim on this node.",
		}),
		PublishedDevices: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "gputopo", Subsystem: "plugin", Name: "published_devices",
			Help: "GPUs published in this node's ResourceSlices.",
		}),
		UnhealthyDevices: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "gputopo", Subsystem: "plugin", Name: "unhealthy_devices",
			Help: "GPUs published with the unhealthy taint.",
		}),
		SkippedDevices: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "gputopo", Subsystem: "plugin", Name: "skipped_devices",
			Help: "GPUs found but not published, by reason (MIG-ENABLED, GPU-LOST, DISCOVERY-ERROR).",
		}, []string{"reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.PrepareDuration, m.UnprepareDuration, m.PrepareErrors,
			m.PreparedClaims, m.PreparedDevices, m.PublishedDevices, m.UnhealthyDevices, m.SkippedDevices)
	}
	return m
}
