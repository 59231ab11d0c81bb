package kubetest

import (
	"os"
	"testing"

	"github.com/migagent/mig-agent/testkit/kubetest/audit"
)

// AuditLog is the audit log of the API server the tests run against.
func AuditLog(t testing.TB) string {
	t.Helper()
	skipIfDisabled(t)
	return audit.LogPath(os.Getenv(EnvStateDir))
}
