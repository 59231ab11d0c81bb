package e2e

import (
	"testing"
	"time"

	"github.com/migagent/mig-agent/agent"
	"github.com/migagent/mig-agent/internal/kubetest"
)

// The basic protocol: label → pending → success, with a complete record.
func TestLabelToSuccess(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	a := StartAgent(t, &Opts{Node: node})
	SelectConfig(t, c, node, "all-balanced")
	rec := WaitState(t, c, node, agent.StateSuccess, "all-balanced", 60*time.Second)
	if len(rec.GPUsChanged) != 8 || rec.ConfigSource != agent.ConfigSourceGenerated || rec.ConfigHash == "" {
		t.Fatalf("record: %+v", rec)
	}
	if rec.RequestedBy != "e2e-test" {
		t.Errorf("requestedBy = %q, want e2e-test", rec.RequestedBy)
	}
	_ = a
}
