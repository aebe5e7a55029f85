package hw

import (
	"os"
	"path/filepath"
	"testing"
)

const routeHeader = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"

func TestDefaultRouteInterface(t *testing.T) {
	tests := []struct {
		name, table, want string
	}{
		{"default route after a subnet route",
			"wlan0\t0001A8C0\t00000000\t0001\t0\t0\t600\t00FFFFFF\t0\t0\t0\n" +
				"eth0\t00000000\t0101A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n", "eth0"},
		{"default route first",
			"wwan0\t00000000\t01000A0A\t0003\t0\t0\t700\t00000000\t0\t0\t0\n" +
				"eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n", "wwan0"},
		{"no default route (offline)",
			"eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n" +
				"docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n", ""},
		{"header only", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "route")
			if err := os.WriteFile(path, []byte(routeHeader+tt.table), 0o644); err != nil {
				t.Fatal(err)
			}
			if got := defaultRouteInterface(path); got != tt.want {
				t.Errorf("defaultRouteInterface = %q, want %q for\n%s", got, tt.want, tt.table)
			}
		})
	}
}

func TestDefaultRouteInterfaceMissingFile(t *testing.T) {
	if got := defaultRouteInterface(filepath.Join(t.TempDir(), "absent")); got != "" {
		t.Errorf("defaultRouteInterface of a missing file = %q, want empty", got)
	}
}
