package simulate

import (
	"fmt"
	"os"
	"path/filepath"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/topology"
)

// ClaimFiles name the manifests pods' claims are made from, read the way
// a user's manifests are: a DeviceClass, a template for whole GPUs (one
// request of an exact count, set to the pod's GPUs) and one for shares
// (one request asking for milliGPU, set to the pod's share).
type ClaimFiles struct {
	DeviceClass, Whole, Share string
}

// DemoClaimFiles are the demo's manifests under the repository root.
func DemoClaimFiles(root string) ClaimFiles {
	dir := filepath.Join(root, "demo", "specs")
	return ClaimFiles{
		DeviceClass: filepath.Join(dir, "deviceclass.yaml"),
		Whole:       filepath.Join(dir, "claims", "gpu-1.yaml"),
		Share:       filepath.Join(dir, "claims", "gpu-share-quarter.yaml"),
	}
}

// Claims makes each pod's ResourceClaim.
type Claims struct {
	class        *resourceapi.DeviceClass
	whole, share *resourceapi.ResourceClaimTemplate
}

// LoadClaims reads and checks the manifests.
func LoadClaims(f ClaimFiles) (*Claims, error) {
	var c Claims
	var err error
	if c.class, err = decodeFile[resourceapi.DeviceClass](f.DeviceClass, "DeviceClass"); err != nil {
		return nil, err
	}
	if c.whole, err = decodeFile[resourceapi.ResourceClaimTemplate](f.Whole, "ResourceClaimTemplate"); err != nil {
		return nil, err
	}
	if c.share, err = decodeFile[resourceapi.ResourceClaimTemplate](f.Share, "ResourceClaimTemplate"); err != nil {
		return nil, err
	}
	for _, t := range []struct {
		tmpl  *resourceapi.ResourceClaimTemplate
		file  string
		share bool
	}{{c.whole, f.Whole, false}, {c.share, f.Share, true}} {
		reqs := t.tmpl.Spec.Spec.Devices.Requests
		if len(reqs) != 1 || reqs[0].Exactly == nil || reqs[0].Exactly.DeviceClassName != c.class.Name {
			return nil, fmt.Errorf("claim template %s must have exactly one request, of an exact count, of DeviceClass %s", t.file, c.class.Name)
		}
		if t.share {
			if cap := reqs[0].Exactly.Capacity; cap == nil || cap.Requests == nil {
				return nil, fmt.Errorf("share template %s must ask for capacity %s", t.file, topology.CapacityMilliGPU)
			}
		}
		t.tmpl.Namespace = "sim"
	}
	return &c, nil
}

func decodeFile[T any](file, kind string) (*T, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w (run from the repository root, or name the manifests with --device-class, --whole-template and --share-template)", kind, err)
	}
	var obj T
	if err := yaml.UnmarshalStrict(data, &obj); err != nil {
		return nil, fmt.Errorf("decode %s %s: %w", kind, file, err)
	}
	return &obj, nil
}

func (c *Claims) evaluator() *devicefit.Evaluator {
	return devicefit.NewEvaluator(devicefit.NewClasses(c.class))
}

// claim is the claim of one pod: gpus whole GPUs, or, when share is
// above 0, that many thousandths of one shared GPU.
func (c *Claims) claim(name string, gpus int, share int) *resourceapi.ResourceClaim {
	if share > 0 {
		tmpl := c.share.DeepCopy()
		req := tmpl.Spec.Spec.Devices.Requests[0].Exactly
		req.Count = 1
		req.Capacity.Requests[topology.CapacityMilliGPU] = *resource.NewQuantity(int64(share), resource.DecimalSI)
		return devicefit.ClaimFromTemplate(tmpl, name)
	}
	tmpl := c.whole.DeepCopy()
	tmpl.Spec.Spec.Devices.Requests[0].Exactly.Count = int64(gpus)
	return devicefit.ClaimFromTemplate(tmpl, name)
}
