// Package mpstest provides a stand-in for nvidia-cuda-mps-control that
// records what it is asked, for tests without a GPU: with -d it starts a
// daemon (a shell that waits) that writes its pid file as the real one
// does, and its pid into /dev/shm/ShmMarker; without, it reads commands from stdin, and "quit" ends the daemon.
package mpstest

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// ShmMarker is the file the daemon writes, with its pid, into the /dev/shm
// it sees.
const ShmMarker = "mps-stand-in.pid"

// Event kinds in the record.
const (
	Start   = "start"   // the daemon was started (-d)
	Command = "command" // a command was sent to it
	Exit    = "exit"    // the daemon ended
)

// Event is one line of the record.
type Event struct {
	Kind string
	// The daemon's environment: its GPU, pipe and log directories.
	VisibleDevices, PipeDir, LogDir string
	// Command is the command sent (Kind Command).
	Command string
	// PID is the daemon's (Kind Start: the pid it runs as, written when
	// it is up; Kind Exit: the pid that ended).
	PID string
}

// script: $0 is the program's own path, which the daemon keeps in its
// command line, as the plugin checks.
const script = `#!/bin/sh
rec=%q
rec() { printf '%%s\t%%s\t%%s\t%%s\t%%s\t%%s\n' "$1" "$CUDA_VISIBLE_DEVICES" "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY" "$2" "$3" >> "$rec"; }
case "$1" in
-d)
	"$0" --serve </dev/null >/dev/null 2>&1 &
	exit 0 ;;
--serve)
	child=
	trap 'rec exit "" $$; [ -n "$child" ] && kill $child; exit 0' TERM
	sleep 2147483647 &
	child=$!
	echo $$ > /dev/shm/%s
	rec start "" $$
	echo $$ > "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid"
	wait $child
	exit 0 ;;
esac
while read -r line; do
	rec command "$line" ""
	if [ "$line" = quit ]; then
		kill "$(cat "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid")" || exit 1
	fi
done
`

// Write writes the stand-in to dir/nvidia-cuda-mps-control, recording to
// record, and returns the program's path.
func Write(dir, record string) (string, error) {
	path := filepath.Join(dir, "nvidia-cuda-mps-control")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(script, record, ShmMarker)), 0o755); err != nil {
		return "", fmt.Errorf("write MPS control stand-in: %w", err)
	}
	return path, nil
}

// Read returns the events recorded so far (none before the first).
func Read(record string) ([]Event, error) {
	f, err := os.Open(record)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	var out []Event
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 6 {
			return nil, fmt.Errorf("MPS stand-in record %s: line %q has %d fields, want 6", record, sc.Text(), len(f))
		}
		out = append(out, Event{Kind: f[0], VisibleDevices: f[1], PipeDir: f[2], LogDir: f[3], Command: f[4], PID: f[5]})
	}
	return out, sc.Err()
}
