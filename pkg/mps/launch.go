package mps

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

// launchEnv, set in the environment of a re-executed plugin binary, makes
// it the daemon's launcher (Launch): its value is the shm directory.
const launchEnv = "GPUTOPO_MPS_LAUNCH_SHM"

// Launch is called first thing by a program that may be a Config.Launcher.
// When this process was started as one, it never returns: in the mount
// namespace of its own that the manager gave it, it binds the GPU's shm
// directory over /dev/shm, which the MPS server and its clients share
// (the clients get the same directory at /dev/shm from the CDI spec), and
// replaces itself with the control program given in its arguments.
// Otherwise it returns at once.
func Launch() {
	shm, ok := os.LookupEnv(launchEnv)
	if !ok {
		return
	}
	if err := launch(shm, os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "MPS control daemon launcher: %v\n", err)
		os.Exit(1)
	}
}

func launch(shm string, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("no control program given")
	}
	if err := syscall.Mount(shm, "/dev/shm", "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s over /dev/shm: %w", shm, err)
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, launchEnv+"=") {
			env = append(env, kv)
		}
	}
	if err := syscall.Exec(args[0], args, env); err != nil {
		return fmt.Errorf("run %s: %w", args[0], err)
	}
	return nil
}
