package main

import (
	"os/exec"
	"strings"
	"testing"
)

// apiGroups are the only API type packages the agent links: the groups
// internal/kclient's scheme holds.
var apiGroups = map[string]bool{
	"k8s.io/api/core/v1":         true,
	"k8s.io/api/coordination/v1": true,
	"k8s.io/api/policy/v1":       true,
	"k8s.io/api/resource/v1":     true,
	// Read where a cluster serves DRA only in an older version.
	"k8s.io/api/resource/v1beta2": true,
	"k8s.io/api/resource/v1beta1": true,
}

// unwanted are packages that once made most of the binary (docs/bench.md,
// "Footprint and latency"): grpc-go (its x/net/trace made the linker keep
// every exported method), and client-go's clientset, its scheme of every
// API group, the informer factory, the dynamic client and discovery.
var unwanted = []string{
	"google.golang.org/grpc",
	"golang.org/x/net/trace",
	"k8s.io/client-go/kubernetes",
	"k8s.io/client-go/informers",
	"k8s.io/client-go/dynamic",
	"k8s.io/client-go/discovery",
}

// TestAgentLinksOnlyWhatItUses guards the binary's size: an import that
// brings the clientset or grpc-go back fails here.
func TestAgentLinksOnlyWhatItUses(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "k8s.io/api/") && !apiGroups[p] {
			t.Errorf("the agent links API group %s (add it to internal/kclient's scheme only if it is read)", p)
		}
		for _, u := range unwanted {
			if p == u || strings.HasPrefix(p, u+"/") {
				t.Errorf("the agent links %s", p)
			}
		}
	}
}
