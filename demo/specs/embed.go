// Package specs holds the demo manifests. The same files are applied by
// `make demo` and the end-to-end tests and read by the unit tests, the
// planner's tests and the simulator, so there is one source of truth for
// what users are shown.
package specs

import (
	"embed"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"
)

// FS holds deviceclass.yaml, claims/*.yaml and workloads/*.yaml.
//
//go:embed deviceclass.yaml claims/*.yaml workloads/*.yaml
var FS embed.FS

// Load decodes one manifest strictly into T.
func Load[T any](name string) (*T, error) {
	data, err := FS.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("read demo spec %s: %w", name, err)
	}
	var obj T
	if err := yaml.UnmarshalStrict(data, &obj); err != nil {
		return nil, fmt.Errorf("decode demo spec %s: %w", name, err)
	}
	return &obj, nil
}

// DeviceClass is the gputopo DeviceClass.
func DeviceClass() (*resourceapi.DeviceClass, error) {
	return Load[resourceapi.DeviceClass]("deviceclass.yaml")
}

// ClaimTemplate is the claim template claims/<name>.yaml.
func ClaimTemplate(name string) (*resourceapi.ResourceClaimTemplate, error) {
	return Load[resourceapi.ResourceClaimTemplate]("claims/" + name + ".yaml")
}
