package kube

import (
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/migagent/mig-agent/published"
	"github.com/migagent/mig-agent/record"
)

// The requester of a change as the agent records it: who asked is read by
// published.RequesterOf (from the requester stamp, else managedFields);
// here, when the agent first saw the request, where the API server kept no
// time, and the log line of each new request.

// requestSeen remembers when the agent first saw a request, for a
// requestedAt that the API server did not record.
type requestSeen struct {
	key string
	at  time.Time
}

// firstSeen returns when the request identified by key was first seen
// (now for a new one) and whether it is new.
func (s *requestSeen) firstSeen(key string, now time.Time) (*time.Time, bool) {
	fresh := s.key != key || s.at.IsZero()
	if fresh {
		s.key, s.at = key, now.UTC()
	}
	at := s.at
	return &at, fresh
}

// requester returns who asked for config, the desired label's value on
// node, filling in when the agent first saw the request where the API
// server did not record the time, and logging each new request once, with
// a stamp that was not used and why.
func (k *Cluster) requester(node *corev1.Node, config string) published.Requester {
	r := published.RequesterOf(node, config)
	now := time.Now()
	if k.Clock != nil {
		now = k.Clock.Now()
	}
	at, fresh := k.seen.firstSeen(config+"\x00"+node.Annotations[record.AnnotationRequestedBy]+"\x00"+r.By, now)
	if r.At == nil {
		r.At = at
	}
	if fresh {
		if r.Ignored != "" {
			k.log().Info("the requester stamp on the Node is not this request's; not used", "annotation", record.AnnotationRequestedBy,
				"config", config, "why", r.Ignored)
		}
		k.log().Info("desired config requested", "config", config, "requestedBy", r.By, "requestedVia", r.Via, "requestedBySource", r.Source)
	}
	return r
}

func (k *Cluster) log() *slog.Logger {
	if k.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return k.Log
}
