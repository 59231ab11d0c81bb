package kube

import (
	"encoding/json"
	"log/slog"
	"time"

	"github.com/migagent/mig-agent/record"
	corev1 "k8s.io/api/core/v1"
)

// Who asked for a value of the desired label. The API server knows who it
// authenticated; the agent learns it from the stamp that the admission
// policy mig-agent-requester (packaging/kubernetes/requester-policy.yaml)
// writes on every write that sets the label to a new value. Without the
// policy, the Node's managedFields name the field manager of the write
// (a name the client chooses: the API server records one for updates and
// patches too, operation Update, unless a client cleared the Node's
// managedFields); failing both, the requester is unknown.
//
// A stamp that is there but does not parse, or names no user, is no
// reason to believe a client-chosen name: the requester is unknown then,
// never the managedFields name. Every Requester says where its name comes
// from (Source: record.RequesterSource*), and the name is bounded
// (record.MaxRequester, marked when cut).

// RequesterStamp is the value of record.AnnotationRequestedBy, as the policy
// writes it.
type RequesterStamp = record.RequesterStamp

// Requester is who asked for a desired config, as a record names it.
type Requester struct {
	// By is the user the API server authenticated, else the field manager,
	// record.RequesterDefaultConfig, record.RequesterStandalone or record.RequesterUnknown.
	By string
	// Via is the field manager of the write, where known.
	Via string
	// At is when the request was made: the managedFields time of the label
	// where the API server kept one, else when the agent first saw it.
	At *time.Time
	// Source says where By comes from: record.RequesterSourceStamp,
	// RequesterSourceManagedFields or RequesterSourceUnknown.
	Source string
	// Ignored says why a stamp on the Node was not used ("" when none was
	// ignored).
	Ignored string
}

// Sources of Requester.By (the record's requestedBySource).
const (
	RequesterFromAdmission     = record.RequesterSourceStamp
	RequesterFromManagedFields = record.RequesterSourceManagedFields
)

// RequesterOf reads who asked for config, the value of the desired label
// on node: the stamp when it was stamped for that value, else the field
// manager in managedFields, else record.RequesterUnknown. A stamp for another
// value is an earlier request's and is not attributed to this one.
func RequesterOf(node *corev1.Node, config string) Requester {
	manager, at := RequestedBy(node)
	var r Requester
	if raw, ok := node.Annotations[record.AnnotationRequestedBy]; ok {
		var s RequesterStamp
		switch err := json.Unmarshal([]byte(raw), &s); {
		case err != nil:
			// Only the policy writes the stamp (mig-agent-records): one that
			// does not parse is the policy's for a name it could not encode.
			// The field manager, a name the client chose, must not stand in.
			r.Ignored = "the stamp is not valid JSON: " + err.Error()
			r.By, r.Source = record.RequesterUnknown, record.RequesterSourceUnknown
			return r
		case s.User == "":
			r.Ignored = "the stamp names no user"
			r.By, r.Source = record.RequesterUnknown, record.RequesterSourceUnknown
			return r
		case s.Config != config:
			r.Ignored = "the stamp is for config " + quote(s.Config) + ", an earlier request"
		default:
			r.By, r.Via, r.Source = record.BoundText(s.User, record.MaxRequester), record.BoundText(s.Via, record.MaxRequester), RequesterFromAdmission
			// The managedFields entry of the label is this write's when it
			// is the same field manager's.
			if manager == s.Via && s.Via != "" {
				r.At = at
			}
			return r
		}
	}
	if manager == record.RequesterUnknown {
		r.By, r.Source = record.RequesterUnknown, record.RequesterSourceUnknown
		return r
	}
	manager = record.BoundText(manager, record.MaxRequester)
	r.By, r.Via, r.At, r.Source = manager, manager, at, RequesterFromManagedFields
	return r
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

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
func (k *Cluster) requester(node *corev1.Node, config string) Requester {
	r := RequesterOf(node, config)
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
