package simulate

import (
	"fmt"
	"os"
	"path/filepath"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/gputopo/gputopo/demo/specs"
	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/topology"
)

// ClaimFiles name the manifests pods' claims are made from, read the way
// a user's manifests are: a DeviceClass, a template for whole GPUs (one
// request of an exact count, set to the pod's GPUs) and one for shares
// (one request asking for milliGPU, set to the pod's share). An empty
// name is the demo's manifest, built into the binary (EmbeddedClaimFiles).
type ClaimFiles struct {
	DeviceClass, Whole, Share string
}

// EmbeddedClaimFiles are the demo's manifests that an empty ClaimFiles
// field stands for, as named in demo/specs.
var EmbeddedClaimFiles = ClaimFiles{
	DeviceClass: "deviceclass.yaml",
	Whole:       "claims/gpu-1.yaml",
	Share:       "claims/gpu-share-quarter.yaml",
}

// DemoClaimFiles are the demo's manifests under the repository root.
func DemoClaimFiles(root string) ClaimFiles {
	dir := filepath.Join(root, "demo", "specs")
	return ClaimFiles{
		DeviceClass: filepath.Join(dir, filepath.FromSlash(EmbeddedClaimFiles.DeviceClass)),
		Whole:       filepath.Join(dir, filepath.FromSlash(EmbeddedClaimFiles.Whole)),
		Share:       filepath.Join(dir, filepath.FromSlash(EmbeddedClaimFiles.Share)),
	}
}

// Claims makes each pod's ResourceClaim.
type Claims struct {
	class        *resourceapi.DeviceClass
	whole, share *resourceapi.ResourceClaimTemplate
}

// LoadClaims reads and checks the manifests; an empty name reads the
// built-in demo manifest.
func LoadClaims(f ClaimFiles) (*Claims, error) {
	var c Claims
	var err error
	var whole, share string
	if c.class, _, err = decodeFile[resourceapi.DeviceClass](f.DeviceClass, EmbeddedClaimFiles.DeviceClass, "DeviceClass"); err != nil {
		return nil, err
	}
	if c.whole, whole, err = decodeFile[resourceapi.ResourceClaimTemplate](f.Whole, EmbeddedClaimFiles.Whole, "ResourceClaimTemplate"); err != nil {
		return nil, err
	}
	if c.share, share, err = decodeFile[resourceapi.ResourceClaimTemplate](f.Share, EmbeddedClaimFiles.Share, "ResourceClaimTemplate"); err != nil {
		return nil, err
	}
	for _, t := range []struct {
		tmpl  *resourceapi.ResourceClaimTemplate
		file  string
		share bool
	}{{c.whole, whole, false}, {c.share, share, true}} {
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

// decodeFile decodes file strictly, or the built-in demo manifest
// embedded when file is empty; name is what errors call it.
func decodeFile[T any](file, embedded, kind string) (obj *T, name string, err error) {
	var data []byte
	if file == "" {
		name = "built-in demo/specs/" + embedded
		data, err = specs.FS.ReadFile(embedded)
	} else {
		name = file
		data, err = os.ReadFile(file)
	}
	if err != nil {
		return nil, name, fmt.Errorf("read %s %s: %w", kind, name, err)
	}
	obj = new(T)
	if err := yaml.UnmarshalStrict(data, obj); err != nil {
		return nil, name, fmt.Errorf("decode %s %s: %w", kind, name, err)
	}
	return obj, name, nil
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
