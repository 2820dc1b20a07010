package cli

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"
)

// Version is what `version` prints: the build of the CLI, read from the
// build information Go stamps into the binary.
type Version struct {
	TypeMeta
	// Version is the module version: a release tag when installed with
	// `go install MODULE@TAG`, "(devel)" when built from a checkout.
	Version string `json:"version"`
	// GitCommit, GitTreeState (clean or dirty) and GitCommitTime describe
	// the checkout it was built from, when built from one.
	GitCommit     string `json:"gitCommit,omitempty"`
	GitTreeState  string `json:"gitTreeState,omitempty"`
	GitCommitTime string `json:"gitCommitTime,omitempty"`
	GoVersion     string `json:"goVersion"`
	Platform      string `json:"platform"`
}

// CurrentVersion is the running binary's version.
func CurrentVersion() Version {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		info = nil
	}
	return VersionOf(info)
}

// VersionOf reads a version from build information; nil (a binary built
// without module support) gives what the runtime knows.
func VersionOf(info *debug.BuildInfo) Version {
	v := Version{Version: "unknown", GoVersion: runtime.Version()}
	goos, goarch := runtime.GOOS, runtime.GOARCH
	if info != nil {
		if info.Main.Version != "" {
			v.Version = info.Main.Version
		}
		if info.GoVersion != "" {
			v.GoVersion = info.GoVersion
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				v.GitCommit = s.Value
			case "vcs.time":
				v.GitCommitTime = s.Value
			case "vcs.modified":
				v.GitTreeState = "clean"
				if s.Value == "true" {
					v.GitTreeState = "dirty"
				}
			case "GOOS":
				goos = s.Value
			case "GOARCH":
				goarch = s.Value
			}
		}
	}
	v.Platform = goos + "/" + goarch
	return v
}

// PrintVersion writes v in format; "" writes it for a person.
func PrintVersion(w io.Writer, v Version, format string) error {
	if format != "" {
		v.TypeMeta = TypeMeta{APIVersion: APIVersion, Kind: KindVersion}
		return printObject(w, &v, format, nil)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Version: %s\n", v.Version)
	if v.GitCommit != "" {
		fmt.Fprintf(&b, "Git commit: %s (%s, %s)\n", v.GitCommit, v.GitTreeState, v.GitCommitTime)
	}
	fmt.Fprintf(&b, "Go: %s %s\n", v.GoVersion, v.Platform)
	_, err := io.WriteString(w, b.String())
	return err
}
