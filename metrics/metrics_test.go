package metrics

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/migagent/mig-agent/record"
)

var update = flag.Bool("update", false, "rewrite testdata/metrics.golden")

// twoGPUs is an H200 in MIG mode with a mixed geometry and one waiting for
// its mode change.
func twoGPUs() []GPU {
	return []GPU{
		{Index: 1, UUID: "GPU-11111111-2222-3333-4444-555555555555", Model: "NVIDIA H200",
			PCIBusID: "00000000:00:07.0", ModePending: true},
		{Index: 0, UUID: "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", Model: "NVIDIA H200",
			PCIBusID: "00000000:00:06.0", MigEnabled: true,
			Instances: map[string]int{"3g.71gb": 1, "2g.35gb": 1, "1g.18gb": 2}},
	}
}

// scrape returns the /metrics text of m's handler in the classic text format.
func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
	}
	return rec.Body.String()
}

func TestGolden(t *testing.T) {
	m := newMetrics("v0.1.0-test", "go1.26.8", false)
	m.SetNVMLUp(true)
	m.SetState(record.StatePending)
	m.SetDesiredConfig("all-1g.18gb")
	m.SetDesiredConfig("all-balanced") // replaces all-1g.18gb
	m.SetGPUs([]GPU{{Index: 2, UUID: "GPU-gone", Model: "NVIDIA H200"}})
	m.SetGPUs(twoGPUs()) // GPU 2 vanished
	m.SetUnusableGPUs([]UnusableGPU{{Index: 3, Error: "ERROR_GPU_IS_LOST"}})
	m.SetUnusableGPUs([]UnusableGPU{{Index: 2, Error: "ERROR_NO_PERMISSION"}}) // replaces GPU 3
	m.AddEvictedPods(3)
	m.AddEvictedPods(-1) // ignored
	m.ObserveReconfiguration(ResultFailed, 3*time.Minute)
	m.SetLastFailure("drain: pods still running after 5m0s: ml/trainer-0")
	m.SetState(record.StateRebooting)
	m.IncReboots()
	m.SetState(record.StateSuccess)
	m.ObserveReconfiguration(ResultSuccess, 42*time.Second)
	m.ObserveReconfiguration(ResultSuccess, 30*time.Millisecond)
	m.SetAppliedConfig("all-1g.18gb", "sha256:0000")
	m.SetAppliedConfig("all-balanced", "sha256:3f1c9a")
	m.SetLastSuccess(time.Date(2026, 3, 1, 12, 0, 0, 500_000_000, time.UTC))
	m.SetLastFailure("")
	m.SetDrift(true)
	m.SetDrift(false)
	m.SetRebootGuardTripped(false)
	m.SetCollectorError("nvml", true)
	m.SetCollectorError("nvml", false)
	m.SetCollectorError("pod-resources", true)
	// A second request that does not fit: failed at once, GPUs untouched.
	m.SetDesiredConfig("all-3g.71gb")
	m.SetState(record.StatePending)
	m.ObserveReconfiguration(ResultFailed, 80*time.Millisecond)
	m.SetLastFailure(`config "all-3g.71gb" does not fit GPU 0 (NVIDIA H200): 3 × 3g.71gb need 12 memory slices, the GPU has 8`)
	m.SetState(record.StateFailed)
	m.SetHeldDevices([]HeldDevice{{UUID: "MIG-gone", Profile: "1g.18gb", GPU: 0, Namespace: "ml", Pod: "old", Container: "main"}})
	m.SetHeldDevices([]HeldDevice{
		{UUID: "MIG-bbbbbbbb-0000-0000-0000-000000000002", Profile: "3g.71gb", GPU: 0, Namespace: "ml", Pod: "trainer-0", Container: "main"},
		{UUID: "MIG-aaaaaaaa-0000-0000-0000-000000000001", Profile: "1g.18gb", GPU: 0, Namespace: "ml", Pod: "notebook", Container: "jupyter"},
		{UUID: "MIG-unresolved", GPU: -1, Namespace: "ml", Pod: "x", Container: "c"},
	}) // replaces MIG-gone

	got := scrape(t, m)
	path := filepath.Join("testdata", "metrics.golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("/metrics differs from %s (run with -update if intended):\n--- got\n%s", path, got)
	}
}

// TestGoldenHasContractMetrics checks that every metric of docs/reference.md#metrics-and-health is in
// the golden file with exactly its type and labels.
func TestGoldenHasContractMetrics(t *testing.T) {
	text, err := os.ReadFile(filepath.Join("testdata", "metrics.golden"))
	if err != nil {
		t.Fatal(err)
	}
	contract := []struct {
		name, typ string
		labels    []string
	}{
		{"migagent_state", "gauge", []string{"state"}},
		{"migagent_desired_config_info", "gauge", []string{"config"}},
		{"migagent_applied_config_info", "gauge", []string{"config", "hash"}},
		{"migagent_gpu_info", "gauge", []string{"UUID", "gpu", "modelName", "pci_bus_id"}},
		{"migagent_gpu_mig_enabled", "gauge", []string{"UUID", "gpu"}},
		{"migagent_gpu_mig_mode_change_pending", "gauge", []string{"UUID", "gpu"}},
		{"migagent_gpu_instances", "gauge", []string{"UUID", "gpu", "profile"}},
		{"migagent_reconfigurations_total", "counter", []string{"result"}},
		{"migagent_reconfiguration_duration_seconds", "histogram", nil},
		{"migagent_evicted_pods_total", "counter", nil},
		{"migagent_reboots_total", "counter", nil},
		{"migagent_last_success_timestamp_seconds", "gauge", nil},
		{"migagent_geometry_drift", "gauge", nil},
		{"migagent_build_info", "gauge", []string{"goversion", "version"}},
		{"migagent_mig_device_info", "gauge", []string{"container", "gpu", "namespace", "pod", "profile", "uuid"}},
	}
	sample := regexp.MustCompile(`(?m)^(\w+)(?:\{([^}]*)\})? `)
	labelName := regexp.MustCompile(`(\w+)="`)
	for _, c := range contract {
		if !strings.Contains(string(text), "# TYPE "+c.name+" "+c.typ+"\n") {
			t.Errorf("%s: no TYPE line of type %s", c.name, c.typ)
			continue
		}
		found := false
		for _, s := range sample.FindAllStringSubmatch(string(text), -1) {
			if s[1] != c.name && (c.typ != "histogram" || s[1] != c.name+"_count") {
				continue
			}
			found = true
			var names []string
			for _, l := range labelName.FindAllStringSubmatch(s[2], -1) {
				names = append(names, l[1])
			}
			sort.Strings(names)
			if !slices.Equal(names, c.labels) {
				t.Errorf("%s: labels %v, want %v", c.name, names, c.labels)
			}
		}
		if !found {
			t.Errorf("%s: no sample", c.name)
		}
	}
}

func TestPromlint(t *testing.T) {
	m := New("v0.1.0") // with the Go and process collectors
	m.SetState(record.StateSuccess)
	m.SetDesiredConfig("all-balanced")
	m.SetAppliedConfig("all-balanced", "sha256:00")
	m.SetGPUs(twoGPUs())
	m.ObserveReconfiguration(ResultSuccess, time.Second)
	m.SetLastFailure("x")
	m.SetCollectorError("nvml", true)
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	// promlint reports camelCase once per series that has such a label; its
	// pattern [a-z][A-Z] matches modelName but not UUID.
	want := []promlint.Problem{
		{Metric: "migagent_gpu_info", Text: "label names should be written in 'snake_case' not 'camelCase'"},
		{Metric: "migagent_gpu_info", Text: "label names should be written in 'snake_case' not 'camelCase'"},
	}
	if !slices.Equal(problems, want) {
		t.Errorf("promlint problems:\n got %v\nwant %v", problems, want)
	}
	// And the only non-snake_case label names are the two DCGM ones.
	snake := regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			for _, l := range mt.GetLabel() {
				if !snake.MatchString(l.GetName()) && l.GetName() != "modelName" && l.GetName() != "UUID" {
					t.Errorf("%s: label %q is not snake_case", mf.GetName(), l.GetName())
				}
			}
		}
	}
}

// series lists the samples of one metric as `{labels} value`, sorted.
func series(t *testing.T, m *Metrics, name string) []string {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, mt := range mf.GetMetric() {
			var ls []string
			for _, l := range mt.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			v := mt.GetGauge().GetValue() + mt.GetCounter().GetValue()
			out = append(out, fmt.Sprintf("{%s} %g", strings.Join(ls, ","), v))
		}
	}
	sort.Strings(out)
	return out
}

func TestSeriesRemoval(t *testing.T) {
	gpu := func(i int, uuid string, mig bool, inst map[string]int) GPU {
		return GPU{Index: i, UUID: uuid, Model: "NVIDIA H200", PCIBusID: fmt.Sprintf("0000:0%d", i),
			MigEnabled: mig, Instances: inst}
	}
	tests := []struct {
		name   string
		do     func(m *Metrics)
		metric string
		want   []string
	}{
		{
			name:   "state: all four present before any state",
			do:     func(m *Metrics) {},
			metric: "migagent_state",
			want:   []string{`{state="failed"} 0`, `{state="pending"} 0`, `{state="rebooting"} 0`, `{state="success"} 0`},
		},
		{
			name:   "state: only the current one is 1",
			do:     func(m *Metrics) { m.SetState(record.StatePending); m.SetState(record.StateFailed) },
			metric: "migagent_state",
			want:   []string{`{state="failed"} 1`, `{state="pending"} 0`, `{state="rebooting"} 0`, `{state="success"} 0`},
		},
		{
			name:   "state: unknown sets all to 0 and adds no series",
			do:     func(m *Metrics) { m.SetState(record.StateSuccess); m.SetState("bogus") },
			metric: "migagent_state",
			want:   []string{`{state="failed"} 0`, `{state="pending"} 0`, `{state="rebooting"} 0`, `{state="success"} 0`},
		},
		{
			name:   "desired: old name removed",
			do:     func(m *Metrics) { m.SetDesiredConfig("a"); m.SetDesiredConfig("b") },
			metric: "migagent_desired_config_info",
			want:   []string{`{config="b"} 1`},
		},
		{
			name: "held devices: a device no longer held is removed",
			do: func(m *Metrics) {
				m.SetHeldDevices([]HeldDevice{{UUID: "MIG-a", Profile: "1g.18gb", GPU: 1, Namespace: "ns", Pod: "p", Container: "c"}})
				m.SetHeldDevices([]HeldDevice{{UUID: "MIG-b", Profile: "2g.35gb", GPU: 2, Namespace: "ns", Pod: "q", Container: "c"}})
			},
			metric: "migagent_mig_device_info",
			want:   []string{`{container="c",gpu="2",namespace="ns",pod="q",profile="2g.35gb",uuid="MIG-b"} 1`},
		},
		{
			name: "held devices: empty removes every series",
			do: func(m *Metrics) {
				m.SetHeldDevices([]HeldDevice{{UUID: "MIG-a", Profile: "1g.18gb", GPU: 1, Namespace: "ns", Pod: "p", Container: "c"}})
				m.SetHeldDevices(nil)
			},
			metric: "migagent_mig_device_info",
		},
		{
			name:   "desired: empty removes",
			do:     func(m *Metrics) { m.SetDesiredConfig("a"); m.SetDesiredConfig("") },
			metric: "migagent_desired_config_info",
		},
		{
			name:   "applied: old name and hash removed",
			do:     func(m *Metrics) { m.SetAppliedConfig("a", "h1"); m.SetAppliedConfig("a", "h2") },
			metric: "migagent_applied_config_info",
			want:   []string{`{config="a",hash="h2"} 1`},
		},
		{
			name: "gpus: vanished GPU removed from gpu_info",
			do: func(m *Metrics) {
				m.SetGPUs([]GPU{gpu(0, "GPU-0", false, nil), gpu(1, "GPU-1", false, nil)})
				m.SetGPUs([]GPU{gpu(1, "GPU-1", false, nil)})
			},
			metric: "migagent_gpu_info",
			want:   []string{`{UUID="GPU-1",gpu="1",modelName="NVIDIA H200",pci_bus_id="0000:01"} 1`},
		},
		{
			name: "gpus: vanished GPU removed from mig_enabled",
			do: func(m *Metrics) {
				m.SetGPUs([]GPU{gpu(0, "GPU-0", true, nil), gpu(1, "GPU-1", false, nil)})
				m.SetGPUs([]GPU{gpu(0, "GPU-0", true, nil)})
			},
			metric: "migagent_gpu_mig_enabled",
			want:   []string{`{UUID="GPU-0",gpu="0"} 1`},
		},
		{
			name: "gpus: replaced GPU (new UUID at same index) leaves no old series",
			do: func(m *Metrics) {
				m.SetGPUs([]GPU{gpu(0, "GPU-old", false, nil)})
				m.SetGPUs([]GPU{gpu(0, "GPU-new", false, nil)})
			},
			metric: "migagent_gpu_mig_mode_change_pending",
			want:   []string{`{UUID="GPU-new",gpu="0"} 0`},
		},
		{
			name: "gpus: vanished profile removed, kept profile updated",
			do: func(m *Metrics) {
				m.SetGPUs([]GPU{gpu(0, "GPU-0", true, map[string]int{"1g.18gb": 7})})
				m.SetGPUs([]GPU{gpu(0, "GPU-0", true, map[string]int{"3g.71gb": 2})})
			},
			metric: "migagent_gpu_instances",
			want:   []string{`{UUID="GPU-0",gpu="0",profile="3g.71gb"} 2`},
		},
		{
			name: "gpus: MIG disabled drops instance series",
			do: func(m *Metrics) {
				m.SetGPUs([]GPU{gpu(0, "GPU-0", true, map[string]int{"1g.18gb": 7})})
				m.SetGPUs([]GPU{gpu(0, "GPU-0", false, map[string]int{"1g.18gb": 7})})
			},
			metric: "migagent_gpu_instances",
		},
		{
			name:   "gpus: duplicate index, later wins",
			do:     func(m *Metrics) { m.SetGPUs([]GPU{gpu(0, "GPU-a", true, nil), gpu(0, "GPU-b", false, nil)}) },
			metric: "migagent_gpu_mig_enabled",
			want:   []string{`{UUID="GPU-b",gpu="0"} 0`},
		},
		{
			name: "gpus: caller's map changed later does not change metrics",
			do: func(m *Metrics) {
				inst := map[string]int{"1g.18gb": 1}
				m.SetGPUs([]GPU{gpu(0, "GPU-0", true, inst)})
				inst["1g.18gb"] = 5
				inst["2g.35gb"] = 1
			},
			metric: "migagent_gpu_instances",
			want:   []string{`{UUID="GPU-0",gpu="0",profile="1g.18gb"} 1`},
		},
		{
			name:   "gpus: empty list removes everything",
			do:     func(m *Metrics) { m.SetGPUs(twoGPUs()); m.SetGPUs(nil) },
			metric: "migagent_gpu_info",
		},
		{
			name: "unusable: replaced as a whole, one series per GPU",
			do: func(m *Metrics) {
				m.SetUnusableGPUs([]UnusableGPU{{Index: 1, Error: "ERROR_GPU_IS_LOST"}})
				m.SetUnusableGPUs([]UnusableGPU{{Index: 5, Error: "ERROR_NO_PERMISSION"}, {Index: 2, Error: "ERROR_NO_PERMISSION"}, {Index: 2, Error: "ERROR_UNKNOWN"}})
			},
			metric: "migagent_gpu_unusable",
			want:   []string{`{error="ERROR_NO_PERMISSION",gpu="2"} 1`, `{error="ERROR_NO_PERMISSION",gpu="5"} 1`},
		},
		{
			name: "unusable: empty list removes",
			do: func(m *Metrics) {
				m.SetUnusableGPUs([]UnusableGPU{{Index: 1, Error: "ERROR_NO_PERMISSION"}})
				m.SetUnusableGPUs(nil)
			},
			metric: "migagent_gpu_unusable",
		},
		{
			name:   "last failure: only the latest reason",
			do:     func(m *Metrics) { m.SetLastFailure("a"); m.SetLastFailure("b") },
			metric: "migagent_last_failure_info",
			want:   []string{`{reason="b"} 1`},
		},
		{
			name:   "last failure: empty removes",
			do:     func(m *Metrics) { m.SetLastFailure("a"); m.SetLastFailure("") },
			metric: "migagent_last_failure_info",
		},
		{
			name:   "last failure: invalid UTF-8 is repaired, not a gather error",
			do:     func(m *Metrics) { m.SetLastFailure("bad \xff byte") },
			metric: "migagent_last_failure_info",
			want:   []string{"{reason=\"bad \ufffd byte\"} 1"},
		},
		{
			name:   "collector: failing then recovered",
			do:     func(m *Metrics) { m.SetCollectorError("nvml", true); m.SetCollectorError("nvml", false) },
			metric: "migagent_collector_failing",
			want:   []string{`{collector="nvml"} 0`},
		},
		{
			name: "collector: errors counted per failure",
			do: func(m *Metrics) {
				m.SetCollectorError("nvml", true)
				m.SetCollectorError("nvml", true)
				m.SetCollectorError("node", false)
			},
			metric: "migagent_collector_errors_total",
			want:   []string{`{collector="node"} 0`, `{collector="nvml"} 2`},
		},
		{
			name:   "reconfigurations: success and failed present from the start",
			do:     func(m *Metrics) { m.ObserveReconfiguration(ResultFailed, time.Second) },
			metric: "migagent_reconfigurations_total",
			want:   []string{`{result="failed"} 1`, `{result="success"} 0`},
		},
		{
			name:   "evicted pods: negative ignored",
			do:     func(m *Metrics) { m.AddEvictedPods(2); m.AddEvictedPods(-5); m.AddEvictedPods(0) },
			metric: "migagent_evicted_pods_total",
			want:   []string{`{} 2`},
		},
		{
			name:   "last success: zero time is 0",
			do:     func(m *Metrics) { m.SetLastSuccess(time.Unix(100, 0)); m.SetLastSuccess(time.Time{}) },
			metric: "migagent_last_success_timestamp_seconds",
			want:   []string{`{} 0`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newMetrics("v", "go", false)
			tt.do(m)
			got := series(t, m, tt.metric)
			if !slices.Equal(got, tt.want) {
				t.Errorf("%s:\n got %q\nwant %q", tt.metric, got, tt.want)
			}
		})
	}
}

func TestTruncate(t *testing.T) {
	m := newMetrics("v", "go", false)
	m.SetLastFailure(strings.Repeat("x", 1000))
	got := series(t, m, "migagent_last_failure_info")
	if len(got) != 1 || len(got[0]) > MaxLabelValueLen+20 {
		t.Errorf("long reason not bounded: %d bytes", len(got[0]))
	}
}

func TestHistogramBuckets(t *testing.T) {
	b := DurationBuckets()
	if b[0] != 0.05 || b[len(b)-1] != 1800 || !slices.IsSorted(b) {
		t.Errorf("buckets %v: want sorted, 0.05 … 1800", b)
	}
	m := newMetrics("v", "go", false)
	m.ObserveReconfiguration(ResultSuccess, -time.Second)
	m.ObserveReconfiguration(ResultSuccess, time.Hour)
	text := scrape(t, m)
	for _, want := range []string{
		`migagent_reconfiguration_duration_seconds_bucket{le="0.05"} 1`,
		`migagent_reconfiguration_duration_seconds_bucket{le="1800"} 1`,
		`migagent_reconfiguration_duration_seconds_bucket{le="+Inf"} 2`,
		`migagent_reconfiguration_duration_seconds_sum 3600`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("missing %q in\n%s", want, text)
		}
	}
}

// TestConcurrentScrape checks that a scrape while GPUs change sees a whole
// snapshot: either both GPUs or the single one, never a mix.
func TestConcurrentScrape(t *testing.T) {
	m := newMetrics("v", "go", false)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if i%2 == 0 {
				m.SetGPUs(twoGPUs())
			} else {
				m.SetGPUs(twoGPUs()[:1])
			}
		}
	})
	for range 200 {
		mfs, err := m.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		var info, enabled int
		for _, mf := range mfs {
			switch mf.GetName() {
			case "migagent_gpu_info":
				info = len(mf.GetMetric())
			case "migagent_gpu_mig_enabled":
				enabled = len(mf.GetMetric())
			}
		}
		if info != enabled {
			t.Fatalf("torn snapshot: %d gpu_info, %d gpu_mig_enabled", info, enabled)
		}
	}
	close(stop)
	wg.Wait()
}

func TestBuildInfo(t *testing.T) {
	m := New("v9.9.9")
	got := series(t, m, "migagent_build_info")
	if len(got) != 1 || !strings.Contains(got[0], `version="v9.9.9"`) || !strings.Contains(got[0], `goversion="go1.`) {
		t.Errorf("build_info = %q", got)
	}
	if !strings.Contains(scrape(t, m), "go_goroutines ") {
		t.Error("New should register the Go collector")
	}
}

func readAll(t *testing.T, r io.Reader) string {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
