package framework

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gputopo/gputopo/pkg/checkpoint"
	cluster "github.com/gputopo/gputopo/test/cluster"
)

// What the kubelet plugin keeps on a real node.

// CheckpointPath is the plugin's checkpoint file on a real node.
func CheckpointPath(c *cluster.Cluster, node string) string {
	_, dir := c.PluginDirs(node)
	return filepath.Join(dir, "checkpoint.json")
}

// LoadCheckpoint reads the plugin's checkpoint on a real node.
func LoadCheckpoint(c *cluster.Cluster, node string) (*checkpoint.Checkpoint, error) {
	cp, err := checkpoint.NewStore(CheckpointPath(c, node)).Load()
	if err != nil {
		return nil, fmt.Errorf("load checkpoint of %s: %w", node, err)
	}
	return cp, nil
}

// FindCDISpec finds the CDI spec file in the node's CDI directory that
// defines devices of a claim (named <claimUID>-...). It fails with an error
// wrapping os.ErrNotExist when there is none.
func FindCDISpec(c *cluster.Cluster, node, claimUID string) (string, *cdispec.Spec, error) {
	cdiDir, _ := c.PluginDirs(node)
	files, err := os.ReadDir(cdiDir)
	if err != nil {
		return "", nil, err
	}
	var found []string
	var spec *cdispec.Spec
	for _, f := range files {
		if f.IsDir() || !(strings.HasSuffix(f.Name(), ".json") || strings.HasSuffix(f.Name(), ".yaml")) {
			continue
		}
		path := filepath.Join(cdiDir, f.Name())
		data, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			continue // removed meanwhile
		}
		if err != nil {
			return "", nil, err
		}
		var s cdispec.Spec
		if err := json.Unmarshal(data, &s); err != nil {
			return path, nil, fmt.Errorf("decode CDI spec %s: %w", path, err)
		}
		if slices.ContainsFunc(s.Devices, func(d cdispec.Device) bool { return strings.HasPrefix(d.Name, claimUID+"-") }) {
			found = append(found, path)
			spec = &s
		}
	}
	switch len(found) {
	case 0:
		return "", nil, fmt.Errorf("no CDI spec in %s for claim %s: %w", cdiDir, claimUID, os.ErrNotExist)
	case 1:
		return found[0], spec, nil
	}
	return "", nil, fmt.Errorf("claim %s has %d CDI specs: %v", claimUID, len(found), found)
}

// Unprepared reports whether the node's plugin has forgotten a claim: no
// checkpoint entry and no CDI spec mentions it. state says what is left.
func Unprepared(c *cluster.Cluster, node, claimUID string) (done bool, state string) {
	cp, err := LoadCheckpoint(c, node)
	if err != nil {
		return false, err.Error()
	}
	if e, ok := cp.Claims[claimUID]; ok {
		return false, fmt.Sprintf("checkpoint still has the claim in state %s", e.State)
	}
	if path, _, err := FindCDISpec(c, node, claimUID); err == nil || !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Sprintf("CDI spec %s still there (%v)", path, err)
	}
	return true, ""
}
