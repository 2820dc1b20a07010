package kubeletplugin

import (
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"

	gcdi "github.com/gputopo/gputopo/pkg/cdi"
)

type ociSpec struct{ s oci.Spec }

func (o *ociSpec) oci() *oci.Spec {
	o.s.Process = &oci.Process{}
	return &o.s
}

func (o *ociSpec) env() map[string]string {
	out := map[string]string{}
	for _, kv := range o.s.Process.Env {
		k, v, _ := strings.Cut(kv, "=")
		out[k] = v
	}
	return out
}

func cdiSpec(uid, device, uuid string) gcdi.ClaimSpec {
	return gcdi.ClaimSpec{ClaimUID: uid, Devices: []gcdi.DeviceEdits{{Name: device, UUID: uuid}}}
}
