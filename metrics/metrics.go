package metrics

import (
	"cmp"
	"maps"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/migagent/mig-agent/record"
)

// Namespace is the prefix of every mig-agent metric.
const Namespace = "migagent"

// Results of migagent_reconfigurations_total that are present from the start.
const (
	ResultSuccess = "success"
	ResultFailed  = "failed"
)

// MaxLabelValueLen bounds free-text label values (the failure reason): longer
// text is cut at a rune boundary and ends with "…".
const MaxLabelValueLen = 256

// states returns every value of the state label, in print order: the
// states of the node's label (package record).
func states() []string {
	return []string{record.StatePending, record.StateRebooting, record.StateSuccess, record.StateFailed}
}

// DurationBuckets returns the buckets of
// migagent_reconfiguration_duration_seconds: from 50 ms (a config that is
// already applied) to 30 min (a drain that waits for long pods, plus a reboot).
func DurationBuckets() []float64 {
	return []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 900, 1200, 1800}
}

// GPU is what the metrics need to know about one GPU.
type GPU struct {
	Index       int
	UUID        string
	Model       string // the device name, as DCGM's modelName: "NVIDIA H200"
	PCIBusID    string
	MigEnabled  bool // current MIG mode
	ModePending bool // a MIG mode change waits for a reset or reboot
	// Instances counts GPU instances per profile name ("1g.18gb" → 7).
	Instances map[string]int
}

// UnusableGPU is a GPU NVML counts but cannot open: the agent leaves it alone.
type UnusableGPU struct {
	Index int
	// Error is NVML's return code name ("ERROR_NO_PERMISSION").
	Error string
}

// HeldDevice is one MIG device a container holds now, as
// migagent_mig_device_info shows it.
type HeldDevice struct {
	UUID      string // the MIG device UUID ("MIG-…")
	Profile   string // "1g.18gb"; empty when the agent could not resolve the device
	GPU       int    // NVML index of the parent GPU; -1 when unknown
	Namespace string
	Pod       string
	Container string
}

// Metrics holds every mig-agent metric on its own registry. The zero value
// is not usable; call New. All methods are safe for concurrent use.
type Metrics struct {
	reg     *prometheus.Registry
	handler http.Handler

	reconfigurations *prometheus.CounterVec
	duration         prometheus.Histogram
	evictedPods      prometheus.Counter
	reboots          prometheus.Counter
	lastSuccess      prometheus.Gauge
	drift            prometheus.Gauge
	nvmlUp           prometheus.Gauge
	rebootGuard      prometheus.Gauge
	resourcesOK      prometheus.Gauge
	collectorErrors  *prometheus.CounterVec

	snap *snapshot
}

// New returns the metrics of an agent of this version, registered on a new
// private registry together with the Go runtime and process collectors.
func New(version string) *Metrics {
	return newMetrics(version, runtime.Version(), true)
}

// newMetrics is New with the Go version fixed and the runtime collectors
// optional, so that tests see the same text on every toolchain.
func newMetrics(version, goVersion string, runtimeCollectors bool) *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{
		reg: reg,
		reconfigurations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "reconfigurations_total",
			Help:      "Reconfigurations finished, by result (success or failed). A config that was already applied counts as success.",
		}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace,
			Name:      "reconfiguration_duration_seconds",
			Help:      "Time from the start of a reconfiguration to its final result, reboots included.",
			Buckets:   DurationBuckets(),
		}),
		evictedPods: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "evicted_pods_total",
			Help:      "Pods evicted because a change took away the GPU or MIG device they used.",
		}),
		reboots: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "reboots_total",
			Help:      "Node reboots the agent requested to finish a MIG mode change.",
		}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace,
			Name:      "last_success_timestamp_seconds",
			Help:      "Unix time of the last reconfiguration that ended in success; 0 if none since start.",
		}),
		drift: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace,
			Name:      "geometry_drift",
			Help:      "1 when the GPUs differ from the applied config (someone changed them behind the agent's back), else 0.",
		}),
		nvmlUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace,
			Name:      "nvml_up",
			Help:      "1 when NVML answered the last call, 0 when the driver or NVML is unavailable.",
		}),
		rebootGuard: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace,
			Name:      "reboot_guard_tripped",
			Help:      "1 when a MIG mode change was still pending after the reboot made for it, so the agent refused to reboot again.",
		}),
		resourcesOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace,
			Name:      "resources_converged",
			Help:      "1 when, after the last change, the Node's allocatable (device plugin) or its gpu.nvidia.com ResourceSlices (DRA driver) showed exactly the new geometry's devices (or there was nothing to wait for); 0 while they did not within --resource-wait-timeout.",
		}),
		collectorErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "collector_errors_total",
			Help:      "Failed attempts to read what the metrics show, by source (nvml, node, pod-resources, ...).",
		}, []string{"collector"}),
		snap: newSnapshot(),
	}
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace:   Namespace,
		Name:        "build_info",
		Help:        "Always 1; the labels name the agent's version and the Go version it was built with.",
		ConstLabels: prometheus.Labels{"version": labelValue(version), "goversion": labelValue(goVersion)},
	})
	buildInfo.Set(1)
	m.resourcesOK.Set(1) // nothing awaited yet
	for _, r := range []string{ResultSuccess, ResultFailed} {
		m.reconfigurations.WithLabelValues(r)
	}
	reg.MustRegister(buildInfo, m.reconfigurations, m.duration, m.evictedPods, m.reboots,
		m.lastSuccess, m.drift, m.nvmlUp, m.rebootGuard, m.resourcesOK, m.collectorErrors, m.snap)
	if runtimeCollectors {
		reg.MustRegister(collectors.NewGoCollector(),
			collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	m.handler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		// A collector that fails loses its own series, not the scrape.
		ErrorHandling: promhttp.ContinueOnError,
		// Adds promhttp_metric_handler_errors_total to the registry.
		Registry: reg,
	})
	return m
}

// Registry returns the private registry holding every metric.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler returns the /metrics handler of the registry (text and
// OpenMetrics formats, content negotiation by promhttp).
func (m *Metrics) Handler() http.Handler { return m.handler }

// SetState sets migagent_state: 1 for state, 0 for the other three. A state
// outside pending, rebooting, success, failed sets all four to 0.
func (m *Metrics) SetState(state string) {
	if !slices.Contains(states(), state) {
		state = ""
	}
	m.snap.update(func(s *snapshot) { s.state = state })
}

// SetDesiredConfig sets migagent_desired_config_info{config=name} to 1 and
// removes the series of the previous name. An empty name removes it.
func (m *Metrics) SetDesiredConfig(name string) {
	m.snap.update(func(s *snapshot) { s.desired = name })
}

// SetAppliedConfig sets migagent_applied_config_info{config,hash} to 1 and
// removes the previous series. An empty name removes it.
func (m *Metrics) SetAppliedConfig(name, hash string) {
	m.snap.update(func(s *snapshot) { s.appliedConfig, s.appliedHash = name, hash })
}

// SetGPUs replaces what the GPU metrics show: migagent_gpu_info,
// migagent_gpu_mig_enabled, migagent_gpu_mig_mode_change_pending and
// migagent_gpu_instances (the last only for GPUs in MIG mode, one series per
// profile in Instances). Series of GPUs and profiles not in gpus are removed.
// Where two entries share an Index, the later one wins.
func (m *Metrics) SetGPUs(gpus []GPU) {
	byIndex := make(map[int]GPU, len(gpus))
	for _, g := range gpus {
		g.Instances = maps.Clone(g.Instances)
		byIndex[g.Index] = g
	}
	list := make([]GPU, 0, len(byIndex))
	for _, g := range byIndex {
		list = append(list, g)
	}
	slices.SortFunc(list, func(a, b GPU) int { return cmp.Compare(a.Index, b.Index) })
	m.snap.update(func(s *snapshot) { s.gpus = list })
}

// SetUnusableGPUs replaces migagent_gpu_unusable: one series, value 1, per
// GPU NVML counts but cannot open, labelled with its index and NVML's error.
// An empty list removes every series.
func (m *Metrics) SetUnusableGPUs(gpus []UnusableGPU) {
	list := slices.Clone(gpus)
	slices.SortFunc(list, func(a, b UnusableGPU) int { return cmp.Compare(a.Index, b.Index) })
	list = slices.CompactFunc(list, func(a, b UnusableGPU) bool { return a.Index == b.Index })
	m.snap.update(func(s *snapshot) { s.unusable = list })
}

// SetHeldDevices replaces migagent_mig_device_info: one series, value 1,
// per container and MIG device it holds now. Series of devices no longer
// held are removed; an empty list removes every series.
func (m *Metrics) SetHeldDevices(held []HeldDevice) {
	list := slices.Clone(held)
	slices.SortFunc(list, func(a, b HeldDevice) int {
		return cmp.Or(cmp.Compare(a.UUID, b.UUID), cmp.Compare(a.Namespace, b.Namespace),
			cmp.Compare(a.Pod, b.Pod), cmp.Compare(a.Container, b.Container))
	})
	list = slices.Compact(list)
	m.snap.update(func(s *snapshot) { s.held = list })
}

// ObserveReconfiguration counts one finished reconfiguration in
// migagent_reconfigurations_total{result} and observes its duration in
// migagent_reconfiguration_duration_seconds. result is success or failed;
// a negative duration counts as 0.
func (m *Metrics) ObserveReconfiguration(result string, d time.Duration) {
	m.reconfigurations.WithLabelValues(labelValue(result)).Inc()
	m.duration.Observe(max(d, 0).Seconds())
}

// AddEvictedPods adds n to migagent_evicted_pods_total; n <= 0 does nothing.
func (m *Metrics) AddEvictedPods(n int) {
	if n > 0 {
		m.evictedPods.Add(float64(n))
	}
}

// IncReboots counts one reboot the agent requested in migagent_reboots_total.
func (m *Metrics) IncReboots() { m.reboots.Inc() }

// SetLastSuccess sets migagent_last_success_timestamp_seconds to t (Unix
// seconds with fraction); the zero time sets 0.
func (m *Metrics) SetLastSuccess(t time.Time) {
	if t.IsZero() {
		m.lastSuccess.Set(0)
		return
	}
	m.lastSuccess.Set(float64(t.UnixNano()) / 1e9)
}

// SetDrift sets migagent_geometry_drift to 1 (the GPUs differ from the
// applied config) or 0.
func (m *Metrics) SetDrift(drift bool) { m.drift.Set(b2f(drift)) }

// SetNVMLUp sets migagent_nvml_up to 1 (NVML answers) or 0.
func (m *Metrics) SetNVMLUp(up bool) { m.nvmlUp.Set(b2f(up)) }

// SetLastFailure sets migagent_last_failure_info{reason} to 1 for the latest
// failure reason only (the previous series is removed, so cardinality stays
// at one); the reason is cut to MaxLabelValueLen bytes. An empty reason
// removes the series (for example after a success).
func (m *Metrics) SetLastFailure(reason string) {
	m.snap.update(func(s *snapshot) { s.lastFailure = record.Truncate(labelValue(reason), MaxLabelValueLen) })
}

// SetRebootGuardTripped sets migagent_reboot_guard_tripped to 1 or 0.
func (m *Metrics) SetRebootGuardTripped(b bool) { m.rebootGuard.Set(b2f(b)) }

// SetResourcesConverged sets migagent_resources_converged to 1 or 0.
func (m *Metrics) SetResourcesConverged(b bool) { m.resourcesOK.Set(b2f(b)) }

// SetCollectorError records the outcome of one attempt to read a source the
// metrics depend on: migagent_collector_failing{collector} is 1 while the
// last attempt failed and 0 after one succeeded, and every failed attempt
// adds 1 to migagent_collector_errors_total{collector}. The caller logs the
// error; collector names are a small fixed set chosen by the caller.
func (m *Metrics) SetCollectorError(collector string, failed bool) {
	collector = labelValue(collector)
	if failed {
		m.collectorErrors.WithLabelValues(collector).Inc()
	} else {
		// Present at 0 once the collector has reported at all.
		m.collectorErrors.WithLabelValues(collector)
	}
	m.snap.update(func(s *snapshot) { s.collectorFailing[collector] = failed })
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// labelValue makes s a valid label value (UTF-8).
func labelValue(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// snapshot is a collector for the metrics whose set of series changes as a
// whole (state, configs, GPUs, last failure, failing collectors): a scrape
// sees either the old set or the new one, never half of each.
type snapshot struct {
	mu               sync.Mutex
	state            string
	desired          string
	appliedConfig    string
	appliedHash      string
	gpus             []GPU
	unusable         []UnusableGPU
	lastFailure      string
	collectorFailing map[string]bool
	held             []HeldDevice

	stateDesc, desiredDesc, appliedDesc                        *prometheus.Desc
	gpuInfoDesc, migEnabledDesc, modePendingDesc, instanceDesc *prometheus.Desc
	unusableDesc, lastFailureDesc, collectorFailingDesc        *prometheus.Desc
	heldDesc                                                   *prometheus.Desc
}

var _ prometheus.Collector = (*snapshot)(nil)

func newSnapshot() *snapshot {
	name := func(n string) string { return prometheus.BuildFQName(Namespace, "", n) }
	return &snapshot{
		collectorFailing: map[string]bool{},
		stateDesc: prometheus.NewDesc(name("state"),
			"The agent's state (the node label nvidia.com/mig.config.state): 1 for the current state, 0 for the others.",
			[]string{"state"}, nil),
		desiredDesc: prometheus.NewDesc(name("desired_config_info"),
			"Always 1; config is the desired config (the node label nvidia.com/mig.config, or the default config).",
			[]string{"config"}, nil),
		appliedDesc: prometheus.NewDesc(name("applied_config_info"),
			"Always 1; config and hash (sha256 of the geometry) of the config last applied with success.",
			[]string{"config", "hash"}, nil),
		gpuInfoDesc: prometheus.NewDesc(name("gpu_info"),
			"Always 1; one series per GPU, labelled as DCGM's exporter labels it (UUID, modelName) so the two join.",
			[]string{"gpu", "UUID", "modelName", "pci_bus_id"}, nil),
		migEnabledDesc: prometheus.NewDesc(name("gpu_mig_enabled"),
			"1 when the GPU's current MIG mode is enabled, else 0.",
			[]string{"gpu", "UUID"}, nil),
		modePendingDesc: prometheus.NewDesc(name("gpu_mig_mode_change_pending"),
			"1 when the GPU's pending MIG mode differs from its current one (it waits for a reset or reboot), else 0.",
			[]string{"gpu", "UUID"}, nil),
		instanceDesc: prometheus.NewDesc(name("gpu_instances"),
			"GPU instances on the GPU, by profile; only for GPUs in MIG mode.",
			[]string{"gpu", "UUID", "profile"}, nil),
		unusableDesc: prometheus.NewDesc(name("gpu_unusable"),
			"Always 1; one series per GPU NVML counts but cannot open (error is NVML's answer, e.g. ERROR_NO_PERMISSION). The agent leaves such a GPU alone, and a config that names it fails.",
			[]string{"gpu", "error"}, nil),
		lastFailureDesc: prometheus.NewDesc(name("last_failure_info"),
			"Always 1; reason is the reason of the latest failure. Absent when the latest reconfiguration succeeded.",
			[]string{"reason"}, nil),
		collectorFailingDesc: prometheus.NewDesc(name("collector_failing"),
			"1 while the last attempt to read the source failed, 0 after one succeeded.",
			[]string{"collector"}, nil),
		heldDesc: prometheus.NewDesc(name("mig_device_info"),
			"Always 1; one series per MIG device (uuid, profile, parent GPU index gpu) and the container holding it now (namespace, pod, container, labelled as DCGM's exporter labels pods so the two join). Absent once the pod is gone; the history keeps it.",
			[]string{"uuid", "profile", "gpu", "namespace", "pod", "container"}, nil),
	}
}

func (s *snapshot) update(f func(*snapshot)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

// Describe implements prometheus.Collector.
func (s *snapshot) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{s.stateDesc, s.desiredDesc, s.appliedDesc,
		s.gpuInfoDesc, s.migEnabledDesc, s.modePendingDesc, s.instanceDesc,
		s.unusableDesc, s.lastFailureDesc, s.collectorFailingDesc, s.heldDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (s *snapshot) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	defer s.mu.Unlock()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		for i := range labels {
			labels[i] = labelValue(labels[i])
		}
		m, err := prometheus.NewConstMetric(d, prometheus.GaugeValue, v, labels...)
		if err != nil {
			m = prometheus.NewInvalidMetric(d, err)
		}
		ch <- m
	}
	for _, st := range states() {
		gauge(s.stateDesc, b2f(st == s.state), st)
	}
	if s.desired != "" {
		gauge(s.desiredDesc, 1, s.desired)
	}
	if s.appliedConfig != "" {
		gauge(s.appliedDesc, 1, s.appliedConfig, s.appliedHash)
	}
	for _, g := range s.gpus {
		idx := strconv.Itoa(g.Index)
		gauge(s.gpuInfoDesc, 1, idx, g.UUID, g.Model, g.PCIBusID)
		gauge(s.migEnabledDesc, b2f(g.MigEnabled), idx, g.UUID)
		gauge(s.modePendingDesc, b2f(g.ModePending), idx, g.UUID)
		if !g.MigEnabled {
			continue
		}
		for profile, n := range g.Instances {
			gauge(s.instanceDesc, float64(n), idx, g.UUID, profile)
		}
	}
	for _, u := range s.unusable {
		gauge(s.unusableDesc, 1, strconv.Itoa(u.Index), u.Error)
	}
	if s.lastFailure != "" {
		gauge(s.lastFailureDesc, 1, s.lastFailure)
	}
	for c, failed := range s.collectorFailing {
		gauge(s.collectorFailingDesc, b2f(failed), c)
	}
	for _, h := range s.held {
		gpu := ""
		if h.GPU >= 0 {
			gpu = strconv.Itoa(h.GPU)
		}
		gauge(s.heldDesc, 1, h.UUID, h.Profile, gpu, h.Namespace, h.Pod, h.Container)
	}
}
