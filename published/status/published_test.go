package status

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/migagent/mig-agent/published"
)

// What the planner reads of a Node (published.NodeOf) is what `mig-agent
// status` shows of it: the same desired config, state, applied config and
// geometry, from every node of the status golden files.
func TestPublishedNodeAgreesWithStatus(t *testing.T) {
	entries, err := os.ReadDir("testdata")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "node") || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		n++
		node := loadNode(t, e.Name())
		st, err := FromNode(node)
		if err != nil {
			t.Fatal(err)
		}
		got := published.NodeOf(node)
		applied := ""
		if st.Applied != nil {
			applied = st.Applied.Config
		}
		if got.Desired != st.Desired || got.State != st.State || got.Applied != applied {
			t.Errorf("%s: published %q/%q/%q, status %q/%q/%q", e.Name(), got.Desired, got.State, got.Applied, st.Desired, st.State, applied)
		}
		if (got.GeometryAt == nil) != (st.GeometryAt == nil) || got.GeometryAt != nil && !got.GeometryAt.Equal(*st.GeometryAt) ||
			len(got.Geometry) != len(st.GPUs) || len(st.GPUs) > 0 && !reflect.DeepEqual(got.Geometry, st.GPUs) {
			t.Errorf("%s: published geometry %+v at %v, status %+v at %v", e.Name(), got.Geometry, got.GeometryAt, st.GPUs, st.GeometryAt)
		}
	}
	if n < 4 {
		t.Fatalf("%d nodes in testdata", n)
	}
}
