package status

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/migagent/mig-agent/published"
	"github.com/migagent/mig-agent/record"
)

var updateStatus = flag.Bool("update-status", false, "rewrite published/status/testdata/*.json and *.txt")

func loadNode(t *testing.T, file string) *corev1.Node {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	var n corev1.Node
	if err := json.Unmarshal(b, &n); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return &n
}

func checkGolden(t *testing.T, file string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", file)
	if *updateStatus {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update-status to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (run with -update-status if intended); got:\n%s", path, got)
	}
}

func TestStatusGolden(t *testing.T) {
	tests := []struct {
		golden, node string
		// Facts checked apart from the golden files, so that a wrong
		// golden file cannot pass unnoticed.
		applied    string // "" for none
		gpus       int
		history    int
		lastChange bool
		notes      []string // substrings, in order
		// requester is "by/source" of Status.Requester, "" for none.
		requester string
	}{
		{golden: "status", node: "node.json", applied: "all-balanced", gpus: 8, history: 4, lastChange: true,
			requester: "alice@example.com/" + published.RequesterFromAdmission},
		{golden: "status-bad", node: "node-bad.json", applied: "all-balanced", gpus: 2, history: 2,
			notes: []string{
				"migagent.io/last-change is not a valid change record: unexpected end of JSON input",
				"entry 1 is not a valid change record: json: cannot unmarshal string",
				"entry 2 is not a valid change record: no config",
				"GPU geometry is from the history record finished 2026-03-01T12:05:44Z",
				`"x" is not a GPU index`,
			},
			requester: record.RequesterUnknown + "/" + record.RequesterSourceUnknown},
		{golden: "status-empty", node: "node-empty.json", notes: []string{
			"label nvidia.com/mig.config is not set",
			"label nvidia.com/mig.config.state is not set",
			"migagent.io/last-change is missing",
			"migagent.io/history is missing",
		}},
		{golden: "status-pending", node: "node-pending.json", lastChange: true,
			notes: []string{`migagent.io/requested-by is not used: the stamp is for config "all-1g.18gb", an earlier request`,
				"migagent.io/history is not a JSON array"},
			requester: record.RequesterUnknown + "/" + record.RequesterSourceUnknown},
	}
	for _, tt := range tests {
		t.Run(tt.golden, func(t *testing.T) {
			s, err := FromNode(loadNode(t, tt.node))
			if err != nil {
				t.Fatal(err)
			}
			if got := appliedName(s); got != tt.applied {
				t.Errorf("applied %q, want %q", got, tt.applied)
			}
			if len(s.GPUs) != tt.gpus || len(s.History) != tt.history || (s.LastChange != nil) != tt.lastChange {
				t.Errorf("gpus %d history %d lastChange %v, want %d %d %v",
					len(s.GPUs), len(s.History), s.LastChange != nil, tt.gpus, tt.history, tt.lastChange)
			}
			if got := ""; s.Requester != nil {
				if got = s.Requester.By + "/" + s.Requester.Source; got != tt.requester {
					t.Errorf("requester %s, want %s", got, tt.requester)
				}
			} else if tt.requester != "" {
				t.Errorf("no requester, want %s", tt.requester)
			}
			if len(s.Notes) != len(tt.notes) {
				t.Errorf("notes %q, want %d like %q", s.Notes, len(tt.notes), tt.notes)
			} else {
				for i, n := range tt.notes {
					if !strings.Contains(s.Notes[i], n) {
						t.Errorf("note %d = %q, want it to contain %q", i, s.Notes[i], n)
					}
				}
			}

			js, err := json.MarshalIndent(s, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			checkGolden(t, tt.golden+".json", append(js, '\n'))
			var back Status
			if err := json.Unmarshal(js, &back); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(normalize(&back), normalize(s)) {
				t.Errorf("JSON round trip changed the status")
			}
		})
	}
}

func appliedName(s *Status) string {
	if s.Applied == nil {
		return ""
	}
	return s.Applied.Config
}

// normalize marshals and unmarshals again, so that time zones and empty
// slices compare equal.
func normalize(s *Status) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func TestStatusGeometry(t *testing.T) {
	rec := record.ChangeRecord{Config: "c", Result: record.StateSuccess,
		Geometry: map[string][]string{
			"1": {"1g.18gb@6", "3g.71gb@0", "1g.18gb@4", "1g.18gb@5"},
			"0": nil,
		}}
	b, _ := json.Marshal(rec)
	s, err := FromNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n",
		Labels:      map[string]string{record.LabelConfig: "c", record.LabelState: record.StateSuccess},
		Annotations: map[string]string{record.AnnotationLastChange: string(b), record.AnnotationHistory: "[" + string(b) + "]"}}})
	if err != nil {
		t.Fatal(err)
	}
	want := []record.GPUGeometry{
		{Index: 0, Instances: []string{}, Profiles: map[string]int{}},
		{Index: 1, Instances: []string{"3g.71gb@0", "1g.18gb@4", "1g.18gb@5", "1g.18gb@6"},
			Profiles: map[string]int{"3g.71gb": 1, "1g.18gb": 3}},
	}
	if !reflect.DeepEqual(s.GPUs, want) {
		t.Errorf("GPUs = %+v, want %+v", s.GPUs, want)
	}
	if len(s.Notes) != 0 {
		t.Errorf("unexpected notes %q", s.Notes)
	}
}

// TestStatusGeometryFallback: a last change that recorded no geometry (a
// failure before anything was touched) shows the newest one in the history.
func TestStatusGeometryFallback(t *testing.T) {
	failed := record.ChangeRecord{Config: "b", Result: record.StateFailed, Reason: "does not fit"}
	ok := record.ChangeRecord{Config: "a", Result: record.StateSuccess, ConfigHash: "sha256:0123456789abcdef",
		FinishedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Geometry:   map[string][]string{"0": {"7g.141gb@0"}}}
	fb, _ := json.Marshal(failed)
	hb, _ := json.Marshal([]record.ChangeRecord{failed, ok})
	s, err := FromNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n",
		Labels:      map[string]string{record.LabelConfig: "b", record.LabelState: record.StateFailed},
		Annotations: map[string]string{record.AnnotationLastChange: string(fb), record.AnnotationHistory: string(hb)}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.GPUs) != 1 || s.GPUs[0].Instances[0] != "7g.141gb@0" || s.GeometryAt == nil || !s.GeometryAt.Equal(ok.FinishedAt) {
		t.Errorf("GPUs %+v at %v, want the success record's", s.GPUs, s.GeometryAt)
	}
	if s.Applied == nil || s.Applied.Config != "a" || s.Applied.Hash != ok.ConfigHash {
		t.Errorf("applied %+v, want config a", s.Applied)
	}
	want := []string{"GPU geometry is from the change finished 2026-01-02T03:04:05Z: the last change recorded none"}
	if !reflect.DeepEqual(s.Notes, want) {
		t.Errorf("notes %q, want %q", s.Notes, want)
	}
}

func TestStatusNilNode(t *testing.T) {
	if _, err := FromNode(nil); !errors.Is(err, ErrNoNode) {
		t.Errorf("err = %v, want ErrNoNode", err)
	}
}
