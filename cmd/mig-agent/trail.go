package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"

	"github.com/migagent/mig-agent/assign"
	"github.com/migagent/mig-agent/assign/track"
	"github.com/migagent/mig-agent/dra"
	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/metrics"
	"github.com/migagent/mig-agent/nvmlx"
	"github.com/migagent/mig-agent/published"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/settings"
)

// newTrail is the assignment trail of a Kubernetes node (nil where
// --assignment-interval is 0): PodResources read every interval, devices
// named through the agent's GPU inventory and the node's ResourceSlices,
// the history in the ConfigMap <node>-mig-assignments, Events on the pods.
func newTrail(s *settings.Settings, log *slog.Logger, m *metrics.Metrics, g nvmlx.GPU, client kclient.Interface,
	readNode func(context.Context) (*corev1.Node, error)) *track.Tracker {
	if s.AssignmentInterval <= 0 {
		return nil
	}
	return &track.Tracker{
		Source: &track.PodResources{Socket: s.PodResourcesSocket},
		Resolve: &track.Inventory{GPU: g, Log: log, Slices: func(ctx context.Context) ([]dra.Slice, error) {
			return dra.NodeSlices(ctx, client, s.NodeName)
		}},
		Store:    &assign.ConfigMapStore{Client: client, Namespace: s.Namespace, Node: s.NodeName},
		Pods:     &track.KubePods{Client: client, Node: s.NodeName, Clock: clock.RealClock{}},
		Records:  changeRecords(client, s.Namespace, s.NodeName, readNode),
		Metrics:  m,
		Clock:    clock.RealClock{},
		Log:      log.With("component", "assignments"),
		Interval: s.AssignmentInterval,
	}
}

// changeRecords are the node's change records, newest first: whole from
// the history ConfigMap (their geometry names the change that made a
// device), else as the Node holds them. The ConfigMap is read again only
// when the Node's last change differs from the one it was read for (the
// agent writes the ConfigMap before the Node), so that polls without a new
// change read only the Node's cached copy.
func changeRecords(client kclient.Interface, namespace, node string,
	readNode func(context.Context) (*corev1.Node, error)) func(context.Context) []record.ChangeRecord {
	onNode := track.NodeRecords(readNode)
	var (
		mu     sync.Mutex
		readAt string // the Node's last change when cached was read
		cached []record.ChangeRecord
	)
	return func(ctx context.Context) []record.ChangeRecord {
		last := ""
		if n, err := readNode(ctx); err == nil && n != nil {
			last = n.Annotations[record.AnnotationLastChange]
		}
		mu.Lock()
		defer mu.Unlock()
		if last != "" && last == readAt {
			return cached
		}
		if recs, _, found, err := published.ReadHistory(ctx, client, namespace, node); err == nil && found && len(recs) > 0 {
			readAt, cached = last, recs
			return recs
		}
		return onNode(ctx)
	}
}

// newHostTrail is the assignment trail of a host without Kubernetes (nil
// where --assignment-interval is 0): the processes NVML reports on each MIG
// device, the history in <state-dir>/assignments.json beside the journal.
func newHostTrail(s *settings.Settings, log *slog.Logger, m *metrics.Metrics, g nvmlx.GPU) *track.Tracker {
	if s.AssignmentInterval <= 0 {
		return nil
	}
	node := s.NodeName
	if node == "" {
		node, _ = os.Hostname()
	}
	return &track.Tracker{
		Source:   &track.Processes{GPU: g},
		Resolve:  &track.Inventory{GPU: g, Log: log},
		Store:    &assign.FileStore{Path: filepath.Join(s.StateDir, assign.FileName), Node: node},
		Metrics:  m,
		Clock:    clock.RealClock{},
		Log:      log.With("component", "assignments"),
		Interval: s.AssignmentInterval,
	}
}

// startTrail runs t beside the daemon until ctx ends or stop is called;
// stop waits for its poll in progress to end. A nil t does nothing.
func startTrail(ctx context.Context, t *track.Tracker) (stop func()) {
	if t == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t.Run(ctx)
	}()
	return func() { cancel(); <-done }
}
