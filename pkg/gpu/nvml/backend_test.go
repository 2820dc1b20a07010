package nvml

import (
	"errors"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestNewInitFailure(t *testing.T) {
	lib := newFakeLib()
	lib.InitFunc = func() gonvml.Return { return gonvml.ERROR_LIBRARY_NOT_FOUND }
	if _, err := New(WithInterface(lib)); !errors.Is(err, gonvml.ERROR_LIBRARY_NOT_FOUND) {
		t.Errorf("New error = %v, want ERROR_LIBRARY_NOT_FOUND", err)
	}
}

func TestCloseOnce(t *testing.T) {
	lib := newFakeLib()
	b, err := New(WithInterface(lib))
	if err != nil {
		t.Fatal(err)
	}
	if b.Name() != "nvml" {
		t.Errorf("Name = %q, want nvml", b.Name())
	}
	for range 2 {
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	if n := len(lib.ShutdownCalls()); n != 1 {
		t.Errorf("Shutdown called %d times, want 1", n)
	}
}
