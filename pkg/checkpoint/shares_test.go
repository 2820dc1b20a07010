package checkpoint

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSharesRoundTripAndHolders(t *testing.T) {
	cp := New()
	share := func(uid, milli string) ClaimState {
		return ClaimState{UID: uid, Namespace: "ns", Name: uid, State: PrepareCompleted, Devices: []PreparedDevice{{
			Request: "gpu", Pool: "node-1", Device: "gpu-0", UUID: "GPU-0", ShareID: "share-" + uid,
			Consumed: map[string]string{"milliGPU": milli, "memory": "0"},
		}}}
	}
	cp.Claims["b"] = share("b", "250")
	cp.Claims["a"] = share("a", "500")
	cp.Claims["w"] = ClaimState{UID: "w", State: PrepareStarted, Devices: []PreparedDevice{{Pool: "node-1", Device: "gpu-1"}}}

	s := newTestStore(t)
	if err := s.Save(cp); err != nil {
		t.Fatal(err)
	}
	got, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(cp, got, cmpIgnoreChecksum); diff != "" {
		t.Errorf("Load after Save (-want +got):\n%s", diff)
	}
	clone := got.Clone()
	clone.Claims["a"].Devices[0].Consumed["milliGPU"] = "1000"
	if got.Claims["a"].Devices[0].Consumed["milliGPU"] != "500" {
		t.Error("Clone shares the consumed capacity map with the original")
	}

	holders := func(device, except string) []string {
		var out []string
		for _, h := range got.Holders("node-1", device, except) {
			out = append(out, h.ClaimUID+"/"+h.Device.ShareID)
		}
		return out
	}
	tests := map[string]struct {
		device, except string
		want           []string
	}{
		"every share, in UID order": {"gpu-0", "", []string{"a/share-a", "b/share-b"}},
		"but the asking claim":      {"gpu-0", "a", []string{"b/share-b"}},
		"a device held whole":       {"gpu-1", "", []string{"w/"}},
		"a free device":             {"gpu-2", "", nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, holders(tc.device, tc.except)); diff != "" {
				t.Errorf("holders (-want +got):\n%s", diff)
			}
		})
	}
}
