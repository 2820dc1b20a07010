package simulate

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"

	specs "github.com/gputopo/gputopo/demo/specs"
	"github.com/gputopo/gputopo/pkg/devicefit"
)

// claims makes each pod's ResourceClaim from the demo's gpu-1 template,
// the one users apply, with the count set to the pod's GPUs: any N GPUs
// of the gputopo DeviceClass on one node.
type claims struct {
	class *resourceapi.DeviceClass
	tmpl  *resourceapi.ResourceClaimTemplate
}

func loadClaims() (*claims, error) {
	var c claims
	var err error
	if c.class, err = specs.DeviceClass(); err != nil {
		return nil, err
	}
	if c.tmpl, err = specs.ClaimTemplate("gpu-1"); err != nil {
		return nil, err
	}
	if len(c.tmpl.Spec.Spec.Devices.Requests) != 1 || c.tmpl.Spec.Spec.Devices.Requests[0].Exactly == nil {
		return nil, fmt.Errorf("demo claim template gpu-1 must have exactly one request of an exact count")
	}
	c.tmpl.Namespace = "sim"
	return &c, nil
}

func (c *claims) evaluator() *devicefit.Evaluator {
	return devicefit.NewEvaluator(devicefit.NewClasses(c.class))
}

// claim is the claim of one pod asking for gpus GPUs.
func (c *claims) claim(name string, gpus int) *resourceapi.ResourceClaim {
	tmpl := c.tmpl.DeepCopy()
	tmpl.Spec.Spec.Devices.Requests[0].Exactly.Count = int64(gpus)
	return devicefit.ClaimFromTemplate(tmpl, name)
}
