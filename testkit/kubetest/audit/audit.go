// Package audit reads the audit log of the API server the tests start
// (hack/kube-apiserver.sh): which requests the server served, by object
// name, user agent and response code.
package audit

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// The API server started by hack/kube-apiserver.sh writes an audit log
// (DIR/audit.log): by default one JSON line per Lease request outside
// kube-system and kube-node-lease, at level Metadata, written when the
// response is complete (KUBE_TEST_AUDIT=all: every request). The server
// counts what it served, by name: the fleet test and the fleet bench tell a
// node's Lease from a rollout slot and a lost race (409) from a take.

// Event is what the tests read of one audit.k8s.io/v1 Event.
type Event struct {
	Verb      string `json:"verb"`
	UserAgent string `json:"userAgent"`
	// User is who the API server authenticated: the name and the extra
	// (a pod-bound ServiceAccount token names its pod's node there).
	User struct {
		Username string              `json:"username"`
		Extra    map[string][]string `json:"extra"`
	} `json:"user"`
	ObjectRef *struct {
		Resource  string `json:"resource"`
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	Stage            string    `json:"stage"`
	RequestReceivedT time.Time `json:"requestReceivedTimestamp"`
}

// Code is the response's HTTP status (0 when the event has none).
func (e Event) Code() int {
	if e.ResponseStatus == nil {
		return 0
	}
	return e.ResponseStatus.Code
}

// Resource, Namespace and Name are the object's ("" when the request names none).
func (e Event) Resource() string {
	if e.ObjectRef == nil {
		return ""
	}
	return e.ObjectRef.Resource
}

func (e Event) Namespace() string {
	if e.ObjectRef == nil {
		return ""
	}
	return e.ObjectRef.Namespace
}

func (e Event) Name() string {
	if e.ObjectRef == nil {
		return ""
	}
	return e.ObjectRef.Name
}

// LogPath is the audit log of the API server whose state dir is dir.
func LogPath(dir string) string { return filepath.Join(dir, "audit.log") }

// Read returns the completed requests of the audit log at path whose
// request was received in [from, to) (a zero to: no end) and for which keep
// (nil: all) says true. The server writes an event when its response is
// complete: call it a moment after the window's last request.
func Read(path string, from, to time.Time, keep func(Event) bool) ([]Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("the API server's audit log: %w", err)
	}
	defer f.Close()
	var out []Event
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		var e Event
		if err := json.Unmarshal(line, &e); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if e.Stage != "ResponseComplete" && e.Stage != "Panic" {
			continue
		}
		if e.RequestReceivedT.Before(from) || (!to.IsZero() && !e.RequestReceivedT.Before(to)) {
			continue
		}
		if keep == nil || keep(e) {
			out = append(out, e)
		}
	}
	return out, sc.Err()
}

// ByUserAgent keeps the requests whose user agent starts with prefix.
func ByUserAgent(prefix string) func(Event) bool {
	return func(e Event) bool { return strings.HasPrefix(e.UserAgent, prefix) }
}
