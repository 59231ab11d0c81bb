package planner

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	corev1 "k8s.io/api/core/v1"

	"github.com/migagent/mig-agent/dra"
	"github.com/migagent/mig-agent/internal/kclient"
)

// MigDeviceClass is the DeviceClass of the MIG devices NVIDIA's DRA driver
// announces (its chart's mig.nvidia.com, selecting the driver's devices of
// type mig). A claim request of that class whose CEL selector names a
// profile asks for a MIG device of that profile.
const MigDeviceClass = "mig.nvidia.com"

// profileSelector finds the profile a CEL selector names: an equality of the
// driver's profile attribute (deviceinfo.go, mig.go of NVIDIA's plugin) with
// a string, either way round, either quote.
var profileSelector = regexp.MustCompile(
	`device\.attributes\[\s*["']gpu\.nvidia\.com["']\s*\]\.profile\s*==\s*["']([^"']+)["']` +
		`|["']([^"']+)["']\s*==\s*device\.attributes\[\s*["']gpu\.nvidia\.com["']\s*\]\.profile`)

// SelectorProfile is the one profile a request's CEL selectors (their
// expressions) name ("" when none names one, or they name several: the
// planner cannot tell which).
func SelectorProfile(selectors []string) string {
	found := ""
	for _, s := range selectors {
		for _, m := range profileSelector.FindAllStringSubmatch(s, -1) {
			p := m[1] + m[2]
			if found != "" && found != p {
				return ""
			}
			found = p
		}
	}
	return found
}

// ClaimWants counts the MIG devices a claim asks for by profile: its
// requests of MigDeviceClass (ExactCount, count 1 unless given) whose
// selectors name a profile. An allocated claim asks for nothing more.
func ClaimWants(claim dra.Claim) map[string]int {
	wants := map[string]int{}
	if claim.Allocated {
		return wants
	}
	for _, r := range claim.Requests {
		if r.Class != MigDeviceClass || r.All {
			continue
		}
		prof := SelectorProfile(r.Selectors)
		if prof == "" {
			continue
		}
		n := r.Count
		if n <= 0 {
			n = 1
		}
		AddWant(wants, prof, n)
	}
	return wants
}

// claimNames are the ResourceClaims a pod uses: named in its spec, or made
// for it from a template (its status names them once the
// resourceclaim-controller made them).
func claimNames(p *corev1.Pod) []string {
	var out []string
	for _, rc := range p.Spec.ResourceClaims {
		if rc.ResourceClaimName != nil {
			out = append(out, *rc.ResourceClaimName)
			continue
		}
		for _, st := range p.Status.ResourceClaimStatuses {
			if st.Name == rc.Name && st.ResourceClaimName != nil {
				out = append(out, *st.ResourceClaimName)
			}
		}
	}
	return out
}

// addClaimWants adds to each pending pod's Wants the MIG devices its
// ResourceClaims ask for: one list of the claims per namespace of such
// pods, in whichever version of resource.k8s.io the API server serves
// (dra.ClaimsIn). A cluster that serves none has none.
func addClaimWants(ctx context.Context, c kclient.Interface, pods []*corev1.Pod, wants []map[string]int) error {
	claims := map[string]map[string]dra.Claim{} // namespace → name → claim
	for i, p := range pods {
		names := claimNames(p)
		if len(names) == 0 {
			continue
		}
		byName, ok := claims[p.Namespace]
		if !ok {
			l, err := dra.ClaimsIn(ctx, c, p.Namespace)
			if err != nil && !errors.Is(err, dra.ErrNoDRA) {
				return fmt.Errorf("namespace %s: %w", p.Namespace, err)
			}
			byName = map[string]dra.Claim{}
			for _, cl := range l {
				byName[cl.Name] = cl
			}
			claims[p.Namespace] = byName
		}
		for _, n := range names {
			if cl, ok := byName[n]; ok {
				for prof, k := range ClaimWants(cl) {
					AddWant(wants[i], prof, int64(k))
				}
			}
		}
	}
	return nil
}
