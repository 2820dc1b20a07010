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
	"io/fs"
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
	sysfs       fs.ReadLinkFS
	health      HealthConfig
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

// WithSysFS reads PCI and NUMA facts from sysfs instead of the host's /sys
// (tests pass a synthetic tree).
func WithSysFS(sysfs fs.ReadLinkFS) Option {
	return func(o *options) { o.sysfs = sysfs }
}

// WithHealth configures which errors make a GPU unhealthy.
func WithHealth(c HealthConfig) Option {
	return func(o *options) { o.health = c }
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
// concurrent use: NVML itself is thread-safe and Backend's own state is
// guarded.
type Backend struct {
	lib         gonvml.Interface
	waitTimeout time.Duration
	sysfs       fs.ReadLinkFS
	health      HealthConfig
	closeOnce   sync.Once
	closeErr    error

	symMu   sync.Mutex
	symbols map[string]bool
}

var _ gpu.Backend = (*Backend)(nil)

// New initialises NVML and returns a backend using it. Close releases it.
func New(opts ...Option) (*Backend, error) {
	o := options{waitTimeout: DefaultEventWaitTimeout, health: DefaultHealthConfig()}
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
		if errors.Is(err, gonvml.ERROR_LIBRARY_NOT_FOUND) {
			return nil, fmt.Errorf("initialise NVML: %w: no libnvidia-ml.so.1 found; is the NVIDIA driver installed, and do --nvidia-driver-root (and --container-driver-root) point at it?", err)
		}
		return nil, fmt.Errorf("initialise NVML: %w", err)
	}
	return &Backend{lib: lib, waitTimeout: o.waitTimeout, sysfs: o.sysfs, health: o.health, symbols: map[string]bool{}}, nil
}

// Library is the initialised NVML library the backend uses, for CDI spec
// generation that must see the same GPUs.
func (b *Backend) Library() gonvml.Interface { return b.lib }

// has reports whether the loaded driver exports an NVML function; the
// answer is cached.
func (b *Backend) has(symbol string) bool {
	b.symMu.Lock()
	defer b.symMu.Unlock()
	ok, known := b.symbols[symbol]
	if !known {
		ok = b.lib.Extensions().LookupSymbol(symbol) == nil
		b.symbols[symbol] = ok
	}
	return ok
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
