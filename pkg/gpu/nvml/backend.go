// Package nvml implements gpu.Backend on top of NVIDIA's management library
// through github.com/NVIDIA/go-nvml.
//
// go-nvml opens libnvidia-ml.so with dlopen when Init is called, so linking
// this package costs nothing on a node without the NVIDIA driver: the library
// is only touched by New, which a binary calls only when it selects this
// backend.
package nvml

import (
	"errors"
	"fmt"
	"sync"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gputopo/gputopo/pkg/gpu"
)

// BackendName is what Backend.Name returns.
const BackendName = "nvml"

// DefaultEventWaitTimeout bounds a single NVML event wait, and so how long
// WatchHealth may take to notice that its context is done.
const DefaultEventWaitTimeout = 5 * time.Second

// Option configures New.
type Option func(*options)

type options struct {
	lib         gonvml.Interface
	libraryPath string
	waitTimeout time.Duration
}

// WithInterface makes the backend use lib instead of loading the real
// library; tests pass go-nvml's mock here.
func WithInterface(lib gonvml.Interface) Option {
	return func(o *options) { o.lib = lib }
}

// WithLibraryPath loads libnvidia-ml from path instead of the dynamic
// linker's search path (driver installed under /run/nvidia/driver and such).
// It is ignored when WithInterface is given.
func WithLibraryPath(path string) Option {
	return func(o *options) { o.libraryPath = path }
}

// WithEventWaitTimeout overrides DefaultEventWaitTimeout.
func WithEventWaitTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.waitTimeout = d
		}
	}
}

// Backend is the NVML implementation of gpu.Backend. It is safe for
// concurrent use: NVML itself is thread-safe and Backend keeps no mutable
// state besides the shutdown guard.
type Backend struct {
	lib         gonvml.Interface
	waitTimeout time.Duration
	closeOnce   sync.Once
	closeErr    error
}

var _ gpu.Backend = (*Backend)(nil)

// New initialises NVML and returns a backend using it. Close releases it.
func New(opts ...Option) (*Backend, error) {
	o := options{waitTimeout: DefaultEventWaitTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	lib := o.lib
	if lib == nil {
		var libOpts []gonvml.LibraryOption
		if o.libraryPath != "" {
			libOpts = append(libOpts, gonvml.WithLibraryPath(o.libraryPath))
		}
		lib = gonvml.New(libOpts...)
	}
	if err := check(lib.Init()); err != nil {
		if o.libraryPath != "" {
			return nil, fmt.Errorf("initialise NVML from %s: %w", o.libraryPath, err)
		}
		return nil, fmt.Errorf("initialise NVML: %w", err)
	}
	return &Backend{lib: lib, waitTimeout: o.waitTimeout}, nil
}

// Name implements gpu.Backend.
func (b *Backend) Name() string { return BackendName }

// Close shuts NVML down; later calls return the first call's result.
func (b *Backend) Close() error {
	b.closeOnce.Do(func() {
		if err := check(b.lib.Shutdown()); err != nil {
			b.closeErr = fmt.Errorf("shut down NVML: %w", err)
		}
	})
	return b.closeErr
}

// check turns an NVML return code into an error; gonvml.Return implements
// error itself, so callers can match with errors.Is(err, gonvml.ERROR_...).
func check(ret gonvml.Return) error {
	if ret == gonvml.SUCCESS {
		return nil
	}
	return ret
}

// unsupported reports whether err means the GPU or driver lacks the feature,
// as opposed to a failure worth surfacing.
func unsupported(err error) bool {
	return errors.Is(err, gonvml.ERROR_NOT_SUPPORTED) ||
		errors.Is(err, gonvml.ERROR_FUNCTION_NOT_FOUND)
}
