package monitoring

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// agentFlagsFile declares the flags of `mig-agent run` and their defaults;
// the other commands' flags are declared in the files beside it.
const agentFlagsFile = "../../cmd/mig-agent/settings.go"

// agentFlags reads the flag names of every mig-agent command, and the
// defaults of the duration and integer flags of `mig-agent run`, from the
// agent's source (fs.Duration("drain-timeout", 5*time.Minute, ...)),
// written as the alert texts write them (5m, 2m).
func agentFlags(t *testing.T) (names map[string]bool, defaults map[string]string) {
	t.Helper()
	src, err := os.ReadFile(agentFlagsFile)
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(filepath.Dir(agentFlagsFile), "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	names = map[string]bool{}
	other := regexp.MustCompile(`\.(?:String|Bool|Duration|Int|StringSlice)(?:Var)?P?\(\s*(?:&\w+,\s*)?"([a-z0-9-]+)"`)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range other.FindAllStringSubmatch(string(b), -1) {
			names[m[1]] = true
		}
	}
	decl := regexp.MustCompile(`fs\.(\w+)\("([a-z0-9-]+)",\s*([^,]+),`)
	// The settings table: {"name", "short", default, "usage", field}.
	entry := regexp.MustCompile(`\{"([a-z0-9-]+)",\s*"[a-z]?",\s*([^,]+),\s*"`)
	dur := regexp.MustCompile(`^(?:(\d+)\s*\*\s*)?time\.(Hour|Minute|Second|Millisecond)$`)
	units := map[string]time.Duration{"Hour": time.Hour, "Minute": time.Minute, "Second": time.Second, "Millisecond": time.Millisecond}
	defaults = map[string]string{}
	var found [][]string
	found = append(found, decl.FindAllStringSubmatch(string(src), -1)...)
	for _, m := range entry.FindAllStringSubmatch(string(src), -1) {
		kind, def := "", strings.TrimSpace(m[2])
		switch {
		case dur.MatchString(def):
			kind = "Duration"
		case regexp.MustCompile(`^[0-9]+$`).MatchString(def):
			kind = "Int"
		case strings.HasPrefix(def, `"`):
			kind, def = "String", strings.Trim(def, `"`)
		}
		found = append(found, []string{m[0], kind, m[1], def})
	}
	for _, m := range found {
		kind, name, def := m[1], m[2], strings.TrimSpace(m[3])
		names[name] = true
		switch kind {
		case "Duration":
			d := dur.FindStringSubmatch(def)
			if d == nil {
				t.Fatalf("%s: the default of --%s, %q, is not N*time.Unit", agentFlagsFile, name, def)
			}
			n := 1
			if d[1] != "" {
				n, _ = strconv.Atoi(d[1])
			}
			defaults[name] = shortDuration(time.Duration(n) * units[d[2]])
		case "Int", "String":
			defaults[name] = def
		}
	}
	if len(names) < 10 || defaults["drain-timeout"] == "" || defaults["resource-wait-timeout"] == "" {
		t.Fatalf("%s: read flags %v, defaults %v: the declarations changed shape", agentFlagsFile, names, defaults)
	}
	return names, defaults
}

// shortDuration writes 5m0s as 5m and 1h0m0s as 1h.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// TestAlertTextsMatchTheAgent: every flag an alert's text names is a flag
// of a mig-agent command, and every default it quotes ("--drain-timeout, default 5m")
// is the agent's default; so a text cannot promise a wait the agent no
// longer makes.
func TestAlertTextsMatchTheAgent(t *testing.T) {
	names, defaults := agentFlags(t)
	plain, _ := loadRules(t)
	flag := regexp.MustCompile(`--([a-z][a-z0-9-]+)`)
	quoted := regexp.MustCompile(`--([a-z][a-z0-9-]+),?\s+default\s+([0-9][0-9a-z]*)`)
	for _, g := range plain.Groups {
		for _, r := range g.Rules {
			for _, a := range []string{"summary", "description"} {
				text := r.Annotations[a]
				for _, m := range flag.FindAllStringSubmatch(text, -1) {
					if !names[m[1]] {
						t.Errorf("%s %s names --%s, which `mig-agent run` does not have", r.Alert, a, m[1])
					}
				}
				for _, m := range quoted.FindAllStringSubmatch(text, -1) {
					if want := defaults[m[1]]; m[2] != want {
						t.Errorf("%s %s: --%s default %s, the agent's is %q", r.Alert, a, m[1], m[2], want)
					}
				}
			}
		}
	}
}

// TestStuckPendingText: the agent ends a change whose device plugin does
// not advertise the new MIG resources within --resource-wait-timeout as
// failed (and one whose pods do not leave within --drain-timeout too), so
// MigAgentStuckPending must not name those as what holds a node in
// pending, and MigAgentFailed must explain the device-plugin failure.
func TestStuckPendingText(t *testing.T) {
	plain, _ := loadRules(t)
	desc := map[string]string{}
	for _, g := range plain.Groups {
		for _, r := range g.Rules {
			desc[r.Alert] = strings.Join(strings.Fields(r.Annotations["description"]), " ")
		}
	}
	stuck := desc["MigAgentStuckPending"]
	for _, f := range []string{"--resource-wait-timeout", "--drain-timeout"} {
		i := strings.Index(stuck, f)
		if i < 0 {
			t.Errorf("MigAgentStuckPending does not say what happens after %s: %s", f, stuck)
			continue
		}
		// The sentence that names the flag says the change ends failed.
		end := strings.Index(stuck[i:], ". ")
		if end < 0 {
			end = len(stuck) - i
		}
		if !strings.Contains(stuck[i:i+end], "failed") {
			t.Errorf("MigAgentStuckPending: the sentence naming %s does not say the change ends failed: %q", f, stuck[i:i+end])
		}
	}
	for _, w := range []string{"rollout slot", "--max-concurrent"} {
		if !strings.Contains(stuck, w) {
			t.Errorf("MigAgentStuckPending does not name %q, what does hold a node in pending: %s", w, stuck)
		}
	}
	// MigAgentFailed quotes the reason the agent gives (reconcile/attempt.go,
	// refresh) and names the flag.
	failed := desc["MigAgentFailed"]
	src, err := os.ReadFile(agentReasonFile)
	if err != nil {
		t.Fatal(err)
	}
	const reason = "but the Node's allocatable did not show exactly its resources within"
	if !strings.Contains(string(src), reason) {
		t.Fatalf("%s no longer gives the reason %q: update MigAgentFailed and this test", agentReasonFile, reason)
	}
	for _, w := range []string{reason, "--resource-wait-timeout", "device plugin"} {
		if !strings.Contains(failed, w) {
			t.Errorf("MigAgentFailed does not explain %q: %s", w, failed)
		}
	}
}

// agentReasonFile gives the reason of a change whose resources did not
// show.
const agentReasonFile = "../../reconcile/attempt.go"
