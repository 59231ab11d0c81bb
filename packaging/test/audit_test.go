package test

import (
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
)

// named returns the one object of kind whose name ends with suffix (the
// chart prefixes the release's name).
func named(t testing.TB, objs []map[string]any, kind, suffix string) map[string]any {
	t.Helper()
	var out []map[string]any
	for _, o := range find(objs, kind) {
		if name, _ := get(o, "metadata", "name").(string); strings.HasSuffix(name, suffix) {
			out = append(out, o)
		}
	}
	if len(out) != 1 {
		t.Fatalf("want one %s named *%s, have %d", kind, suffix, len(out))
	}
	return out[0]
}

func variable(obj map[string]any, name string) any {
	for _, v := range asList(get(obj, "spec", "variables")) {
		if get(v, "name") == name {
			return get(v, "expression")
		}
	}
	return nil
}

// TestAuditPolicies: the records policy admits only the stamp that the
// requester policy writes (the same expression, letter for letter), and
// the chart makes both its release's: the agent's user, the binding's
// policy.
func TestAuditPolicies(t *testing.T) {
	plain := readPlain(t)
	mapol := named(t, plain, "MutatingAdmissionPolicy", "mig-agent-requester")
	records := named(t, plain, "ValidatingAdmissionPolicy", "mig-agent-records")
	stamp, ok := variable(mapol, "stamp").(string)
	if !ok || stamp == "" || variable(records, "stamp") != stamp {
		t.Errorf("the stamp of the records policy is not the requester policy's:\n%v\n%v", variable(records, "stamp"), stamp)
	}
	if req, ok := variable(mapol, "requester").(string); !ok || req == "" || variable(records, "requester") != req {
		t.Errorf("the requester of the records policy is not the requester policy's:\n%v\n%v", variable(records, "requester"), req)
	}
	if got := variable(records, "agentUser"); got != "'system:serviceaccount:mig-agent:mig-agent'" {
		t.Errorf("plain agentUser %v", got)
	}

	objs := objects(t, mustRender(t, renderCase{"full", "gpu", "gpu-system", ""}, map[string]any{"fullnameOverride": "gpu-mig"}))
	rec := named(t, objs, "ValidatingAdmissionPolicy", "-records")
	sa := get(one(t, objs, "DaemonSet"), "spec", "template", "spec", "serviceAccountName")
	if got := variable(rec, "agentUser"); sa == nil || got != "'system:serviceaccount:gpu-system:"+sa.(string)+"'" {
		t.Errorf("the records policy's agent is %v, want the release's ServiceAccount", got)
	}
	// The assignment trail's policy: the release's agent, and so its
	// namespace (agentNamespace is read from agentUser).
	asg := named(t, objs, "ValidatingAdmissionPolicy", "-assignments")
	if got := variable(asg, "agentUser"); sa == nil || got != "'system:serviceaccount:gpu-system:"+sa.(string)+"'" {
		t.Errorf("the assignments policy's agent is %v, want the release's ServiceAccount", got)
	}
	if b := named(t, objs, "ValidatingAdmissionPolicyBinding", "-assignments"); get(b, "spec", "policyName") != get(asg, "metadata", "name") {
		t.Errorf("the assignments policy %v is bound as %v", get(asg, "metadata", "name"), get(b, "spec", "policyName"))
	}
	for _, kind := range []string{"ValidatingAdmissionPolicy", "MutatingAdmissionPolicy"} {
		suffix := map[string]string{"ValidatingAdmissionPolicy": "-records", "MutatingAdmissionPolicy": "-requester"}[kind]
		p := named(t, objs, kind, suffix)
		b := named(t, objs, kind+"Binding", suffix)
		if get(b, "spec", "policyName") != get(p, "metadata", "name") || !strings.HasPrefix(get(p, "metadata", "name").(string), "gpu-mig") {
			t.Errorf("%s %v is bound as %v", kind, get(p, "metadata", "name"), get(b, "spec", "policyName"))
		}
	}
	if variable(named(t, objs, "MutatingAdmissionPolicy", "-requester"), "stamp") != stamp {
		t.Error("the chart's stamp differs from the plain manifests'")
	}
}

// TestRequesterPolicyKubeVersion: the MutatingAdmissionPolicy (v1 since
// Kubernetes 1.36) is rendered from 1.36 on, left out before with a note
// that says what the records name instead, and never with
// requesterPolicy.enabled=false; the records policy comes with the
// admission policy.
func TestRequesterPolicyKubeVersion(t *testing.T) {
	off := map[string]any{"requesterPolicy": map[string]any{"enabled": false}}
	for _, tc := range []struct {
		version string
		vals    map[string]any
		want    bool
	}{
		{"v1.35.3", nil, false},
		{"v1.36.0", nil, true},
		{"v1.37.2", nil, true},
		{"v1.37.2", off, false},
	} {
		out, err := renderAt(t, tc.version, "mig-agent", "mig-agent", tc.vals)
		if err != nil {
			t.Fatalf("%s: %v", tc.version, err)
		}
		objs := objects(t, out)
		if got := len(find(objs, "MutatingAdmissionPolicy")) == 1 && len(find(objs, "MutatingAdmissionPolicyBinding")) == 1; got != tc.want {
			t.Errorf("%s %v: requester policy rendered %v, want %v", tc.version, tc.vals, got, tc.want)
		}
		named(t, objs, "ValidatingAdmissionPolicy", "-records")
		notes, err := notesAt(t, tc.version, tc.vals)
		if err != nil {
			t.Fatal(err)
		}
		if warned := strings.Contains(notes, "has no MutatingAdmissionPolicy v1"); warned != (!tc.want && tc.vals == nil) {
			t.Errorf("%s %v: NOTES warn %v:\n%s", tc.version, tc.vals, warned, notes)
		}
	}
}

// notesAt renders NOTES.txt at a Kubernetes version, with vals.
func notesAt(t *testing.T, version string, vals map[string]any) (string, error) {
	t.Helper()
	chrt, err := loader.Load(chartDir)
	if err != nil {
		return "", err
	}
	opts := common.ReleaseOptions{Name: "mig-agent", Namespace: "mig-agent", Revision: 1, IsInstall: true}
	rv, err := util.ToRenderValuesWithSchemaValidation(chrt, vals, opts, capabilitiesAt(t, version), false)
	if err != nil {
		return "", err
	}
	files, err := engine.Render(chrt, rv)
	if err != nil {
		return "", err
	}
	return files["mig-agent/templates/NOTES.txt"], nil
}

// TestLeaseEventPolicies: the chart renders the lease and event policies
// for its release: bound by their renamed names, matching the release's
// ServiceAccount; the plain manifests' match the agent of mig-agent.
func TestLeaseEventPolicies(t *testing.T) {
	plain := readPlain(t)
	objs := objects(t, mustRender(t, renderCase{"full", "gpu", "gpu-system", ""}, map[string]any{"fullnameOverride": "gpu-mig"}))
	sa := get(one(t, objs, "DaemonSet"), "spec", "template", "spec", "serviceAccountName")
	for _, suffix := range []string{"-leases", "-events"} {
		want := map[string]string{
			"plain": "request.userInfo.username == 'system:serviceaccount:mig-agent:mig-agent'",
			"chart": "request.userInfo.username == 'system:serviceaccount:gpu-system:" + sa.(string) + "'",
		}
		for which, set := range map[string][]map[string]any{"plain": plain, "chart": objs} {
			p := named(t, set, "ValidatingAdmissionPolicy", suffix)
			b := named(t, set, "ValidatingAdmissionPolicyBinding", suffix)
			if get(b, "spec", "policyName") != get(p, "metadata", "name") {
				t.Errorf("%s %s: bound as %v", which, get(p, "metadata", "name"), get(b, "spec", "policyName"))
			}
			conds := asList(get(p, "spec", "matchConditions"))
			if len(conds) != 1 || get(conds[0], "expression") != want[which] {
				t.Errorf("%s %s matches %v, want %s", which, get(p, "metadata", "name"), conds, want[which])
			}
		}
	}
}
