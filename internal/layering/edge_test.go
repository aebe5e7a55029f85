package layering

import "testing"

// The edge binary carries no test scaffolding: the fleet simulator and its in-memory runtime are a
// command of their own, and the test environments stay in tests.
func TestEdgeBinaryCarriesNoTestScaffolding(t *testing.T) {
	if bad := forbidden(t, "github.com/mqlet/mqlet/cmd/mqlet",
		"github.com/mqlet/mqlet/cmd/mqlet-fleetsim",
		"github.com/mqlet/mqlet/internal/testenv", "github.com/mqlet/mqlet/internal/mqtttest",
		"github.com/mqlet/mqlet/internal/kubetest", "github.com/mqlet/mqlet/internal/testpki",
		"github.com/mqlet/mqlet/internal/loopback", "testing"); len(bad) > 0 {
		t.Errorf("the edge binary links test scaffolding: %v", bad)
	}
}

// node/ is the composition root: commands build nodes with it, and no library part depends on it
// (a part that needs another gets it handed in by node.New).
func TestOnlyCommandsImportTheCompositionRoot(t *testing.T) {
	for _, pattern := range []string{"github.com/mqlet/mqlet/agent/...", "github.com/mqlet/mqlet/store/...",
		"github.com/mqlet/mqlet/sync/...", "github.com/mqlet/mqlet/bridge/...", "github.com/mqlet/mqlet/hw/..."} {
		if bad := forbidden(t, pattern, "github.com/mqlet/mqlet/node"); len(bad) > 0 {
			t.Errorf("%s imports the composition root: %v", pattern, bad)
		}
	}
}
