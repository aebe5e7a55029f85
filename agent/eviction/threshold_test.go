package eviction

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestParseThresholdsDefaults(t *testing.T) {
	ts, err := ParseThresholds(DefaultHard(), nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 5 {
		t.Fatalf("got %d thresholds, want 5: %+v", len(ts), ts)
	}
	for _, th := range ts {
		if !th.Hard() {
			t.Errorf("%s: default threshold is not hard", th.Signal)
		}
		if th.Signal == SignalMemoryAvailable && th.Value.Of(0) != 100<<20 {
			t.Errorf("memory.available = %d, want 100Mi", th.Value.Of(0))
		}
		if th.Signal == SignalNodeFsAvailable && th.Value.Of(1000) != 100 {
			t.Errorf("nodefs.available of 1000 = %d, want 100", th.Value.Of(1000))
		}
	}
}

func TestParseThresholdsSoftAndErrors(t *testing.T) {
	ts, err := ParseThresholds(map[string]string{"memory.available": "0"},
		map[string]string{"memory.available": "300Mi"}, map[string]string{"memory.available": "30s"},
		map[string]string{"memory.available": "50Mi"})
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 1 || ts[0].Hard() || ts[0].GracePeriod != 30*time.Second || ts[0].MinReclaim.Of(0) != 50<<20 {
		t.Fatalf("got %+v, want one soft memory threshold with 30s grace and 50Mi reclaim", ts)
	}
	for _, tc := range []struct {
		hard, soft, grace map[string]string
		want              string
	}{
		{map[string]string{"memory.avail": "1Mi"}, nil, nil, `unknown signal "memory.avail"`},
		{map[string]string{"nodefs.available": "120%"}, nil, nil, "from 0 to 100"},
		{map[string]string{"memory.available": "lots"}, nil, nil, "want a quantity"},
		{nil, map[string]string{"memory.available": "1Gi"}, nil, "needs a grace period"},
		{nil, nil, map[string]string{"memory.available": "1m"}, "no evictionSoft threshold"},
		{nil, map[string]string{"memory.available": "1Gi"}, map[string]string{"memory.available": "soon"}, "positive duration"},
	} {
		_, err := ParseThresholds(tc.hard, tc.soft, tc.grace, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseThresholds(%v, %v, %v) = %v, want an error with %q", tc.hard, tc.soft, tc.grace, err, tc.want)
		}
	}
}

func TestHardReserve(t *testing.T) {
	ts, _ := ParseThresholds(DefaultHard(), nil, nil, nil)
	got := HardReserve(ts, v1.ResourceList{
		v1.ResourceMemory:           resource.MustParse("1Gi"),
		v1.ResourceEphemeralStorage: resource.MustParse("10Gi"),
	})
	if m := got[v1.ResourceMemory]; m.Value() != 100<<20 {
		t.Errorf("memory reserve = %s, want 100Mi", m.String())
	}
	if s := got[v1.ResourceEphemeralStorage]; s.Value() != 1<<30 {
		t.Errorf("ephemeral-storage reserve = %s, want 1Gi (10%% of 10Gi)", s.String())
	}
}
