package published

import (
	"encoding/json"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/migagent/mig-agent/internal/labelwriter"
	"github.com/migagent/mig-agent/record"
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
	manager, at := requestedBy(node)
	var r Requester
	if raw, ok := node.Annotations[record.AnnotationRequestedBy]; ok {
		var s record.RequesterStamp
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

// requestedBy names the field manager that last set the desired label, read
// from the Node's managedFields, and when; record.RequesterUnknown when no
// entry owns it.
func requestedBy(node *corev1.Node) (string, *time.Time) {
	manager, at, ok := labelwriter.Of(node.ManagedFields, record.LabelConfig)
	if !ok {
		return record.RequesterUnknown, nil
	}
	return manager, at
}
