package e2e

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/migagent/mig-agent/published"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// Findings 6 and 7 on the real API server under the shipped policies: a
// user name with a control character (a tab, which an HTTP header can
// carry: the admin impersonates such a user) and a 40,000-character one
// both get a stamp that is JSON, names that user (the long one by its
// start, marked), and is the agent's requester with source stamp, not the
// field manager the client chose.
func TestAuditRequesterOddNames(t *testing.T) {
	admin := kubetest.Client(t)
	in := pkgDescribe(t, pkgPlain(t))
	pkgApply(t, in.objs, false)
	requester := pkgNamed(t, in.objs, "MutatingAdmissionPolicy", "-requester").GetName()
	probe := kubetest.NewName(t, "probe")
	kubetest.CreateNode(t, probe, map[string]string{pkgAuditScope: in.namespace})
	as := func(user string) kubernetes.Interface {
		cfg := rest.CopyConfig(kubetest.RestConfig(t))
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:masters"}}
		c, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	i := 0
	WaitFor(t, policyTimeout, "the policy "+requester+" to stamp", func() bool {
		i++
		if err := auditPatch(admin, probe, "", false, auditLabel(fmt.Sprintf("probe-%d", i))); err != nil {
			t.Fatal(err)
		}
		s, ok := auditStamp(t, admin, probe)
		return ok && s.Config == fmt.Sprintf("probe-%d", i)
	})
	long := strings.Repeat("m", 40000)
	for _, tc := range []struct {
		name, user, want string
	}{
		{"a tab", "mallory\tx", "mallory\tx"},
		{"a quote and a backslash", `mal"lo\ry`, `mal"lo\ry`},
		{"40000 characters", long, strings.Repeat("m", 200) + " …[40000 characters in all]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			i++
			config := fmt.Sprintf("probe-%d", i)
			// The client claims a field manager that names someone else.
			if err := auditPatch(as(tc.user), probe, "alice@example.com", false, auditLabel(config)); err != nil {
				t.Fatal(err)
			}
			s, ok := auditStamp(t, admin, probe) // fails the test when it is not JSON
			if !ok || s.User != tc.want || s.Config != config {
				t.Fatalf("stamp %+v, want user %q", s, text(tc.want))
			}
			r := published.RequesterOf(GetNode(t, admin, probe), config)
			if r.Source != record.RequesterSourceStamp || r.By != record.BoundText(tc.want, record.MaxRequester) {
				t.Errorf("requester %+v, want the stamp's user", r)
			}
		})
	}
}

func text(s string) string {
	if len(s) > 60 {
		return s[:60] + "…"
	}
	return s
}
