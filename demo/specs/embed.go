// Package specs holds the demo manifests. The same files are applied by
// `make demo` and the end-to-end tests and read by the unit tests, so there
// is one source of truth for what users are shown.
package specs

import "embed"

// FS holds deviceclass.yaml, claims/*.yaml and workloads/*.yaml.
//
//go:embed deviceclass.yaml claims/*.yaml workloads/*.yaml
var FS embed.FS
