package status

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/migagent/mig-agent/record"
)

// The text of mig-agent status for the agent's status test cases (the
// model and its JSON are checked in status_test.go).
func TestStatusTextGolden(t *testing.T) {
	for golden, node := range map[string]string{
		"status": "node.json", "status-bad": "node-bad.json", "status-empty": "node-empty.json", "status-pending": "node-pending.json",
	} {
		t.Run(golden, func(t *testing.T) {
			s, err := FromNode(loadNode(t, node))
			if err != nil {
				t.Fatal(err)
			}
			var text bytes.Buffer
			if err := WriteText(&text, s); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", golden+".txt")
			if *updateStatus {
				if err := os.WriteFile(path, text.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update-status to create it)", err)
			}
			if !bytes.Equal(text.Bytes(), want) {
				t.Errorf("%s differs (run with -update-status if intended); got:\n%s", path, text.Bytes())
			}
		})
	}
}

func TestStatusTextProfileSummary(t *testing.T) {
	rec := record.ChangeRecord{Config: "c", Result: record.StateSuccess, ServedBy: record.ServedByDRA,
		Geometry: map[string][]string{"1": {"1g.18gb@6", "3g.71gb@0", "1g.18gb@4", "1g.18gb@5"}, "0": nil}}
	b, _ := json.Marshal(rec)
	s, err := FromNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n",
		Labels:      map[string]string{record.LabelConfig: "c", record.LabelState: record.StateSuccess},
		Annotations: map[string]string{record.AnnotationLastChange: string(b), record.AnnotationHistory: "[" + string(b) + "]"}}})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := WriteText(&out, s); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "1x 3g.71gb, 3x 1g.18gb") {
		t.Errorf("profile summary missing:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "Served by") || !strings.Contains(out.String(), "dra") {
		t.Errorf("allocation path missing:\n%s", out.String())
	}
}

func TestShortDigests(t *testing.T) {
	tests := []struct{ in, want string }{
		{"sha256:0123456789abcdef", "sha256:0123456789ab"},
		{"/etc/c.yaml@sha256:0123456789abcdef0123", "/etc/c.yaml@sha256:0123456789ab"},
		{"sha256:abc", "sha256:abc"},
		{"generated", "generated"},
		{"sha256:0123456789abcdef sha256:fedcba9876543210", "sha256:0123456789ab sha256:fedcba987654"},
	}
	for _, tt := range tests {
		if got := shortDigests(tt.in); got != tt.want {
			t.Errorf("shortDigests(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestStatusControlCharacters(t *testing.T) {
	rec := record.ChangeRecord{Config: "c", Result: record.StateFailed, Reason: "line1\nline2\x1b[31mred\tend"}
	b, _ := json.Marshal(rec)
	s, err := FromNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n",
		Annotations: map[string]string{record.AnnotationLastChange: string(b), record.AnnotationHistory: "[" + string(b) + "]"}}})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := WriteText(&out, s); err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(out.String(), "\x1b\t") || strings.Contains(out.String(), "line1\n") {
		t.Errorf("control characters reached the output:\n%q", out.String())
	}
}

type failingWriter struct{ n int }

func (f *failingWriter) Write(b []byte) (int, error) {
	if f.n == 0 {
		return 0, errors.New("disk full")
	}
	f.n--
	return len(b), nil
}

func TestStatusWriteError(t *testing.T) {
	s, err := FromNode(loadNode(t, "node.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, 3, 10} {
		if err := WriteText(&failingWriter{n: n}, s); err == nil || err.Error() != "disk full" {
			t.Errorf("after %d writes: err = %v, want disk full", n, err)
		}
	}
}
