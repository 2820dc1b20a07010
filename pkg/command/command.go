// Package command holds what gputopo's daemons share around their logic:
// flag parsing with component-base logging and an environment variable
// for every flag, a signal-aware context, a Kubernetes client from a
// kubeconfig, and the Prometheus endpoint.
package command

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"
)

// ErrHelp is returned by Parse when the user asked for --help.
var ErrHelp = pflag.ErrHelp

// EnvName is the environment variable that sets a flag the command line
// leaves out: --node-name is NODE_NAME, --kube-api-qps is KUBE_API_QPS.
func EnvName(flag string) string {
	return strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// Parse adds the logging flags to fs, parses args, takes every flag that
// was already in fs and is not on the command line from its environment
// variable (EnvName), runs validate and applies the logging configuration.
// The returned function flushes logs.
func Parse(fs *pflag.FlagSet, args []string, validate func() error) (flush func(), err error) {
	fromEnv := EnvFallback(fs)
	logConfig := logsapi.NewLoggingConfiguration()
	logsapi.AddFlags(logConfig, fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if err := fromEnv(); err != nil {
		return nil, err
	}
	if validate != nil {
		if err := validate(); err != nil {
			return nil, err
		}
	}
	if err := logsapi.ValidateAndApply(logConfig, nil); err != nil {
		return nil, err
	}
	return logs.FlushLogs, nil
}

// EnvFallback names the environment variable of every flag now in fs in
// its usage. The returned function, called after parsing, sets each of
// those flags that the command line left out and whose variable is not
// empty, as the example DRA driver and NVIDIA's do.
func EnvFallback(fs *pflag.FlagSet) (apply func() error) {
	var own []*pflag.Flag
	fs.VisitAll(func(f *pflag.Flag) {
		f.Usage += " [$" + EnvName(f.Name) + "]"
		own = append(own, f)
	})
	return func() error {
		for _, f := range own {
			env := EnvName(f.Name)
			if v, ok := os.LookupEnv(env); ok && v != "" && !f.Changed {
				if err := fs.Set(f.Name, v); err != nil {
					return fmt.Errorf("$%s=%q for --%s: %w", env, v, f.Name, err)
				}
			}
		}
		return nil
	}
}

// Namespace is the namespace a daemon runs in: $POD_NAMESPACE (the
// downward API), else kube-system.
func Namespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	return "kube-system"
}

// Context is cancelled on SIGINT or SIGTERM and carries the klog logger.
func Context() (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	return klog.NewContext(ctx, klog.Background()), stop
}

// ClientOptions tune the client of Client.
type ClientOptions struct {
	// QPS and Burst limit requests to the API server; zero keeps
	// client-go's defaults (5 and 10).
	QPS   float32
	Burst int
	// NoCompression asks for responses as they are instead of gzip,
	// saving the CPU that compressing and inflating the watches of a
	// large cluster costs on both ends for traffic inside the cluster.
	NoCompression bool
	// ContentType is the wire format of requests and responses:
	// ContentTypeProtobuf (with JSON accepted for any API that has no
	// protobuf) or ContentTypeJSON; empty is JSON.
	ContentType string
}

// Wire formats of ClientOptions.ContentType.
const (
	ContentTypeProtobuf = "application/vnd.kubernetes.protobuf"
	ContentTypeJSON     = "application/json"
)

// Client builds a clientset from a kubeconfig file, or from the in-cluster
// configuration when the path is empty.
func Client(kubeconfig string, opts ClientOptions) (kubernetes.Interface, error) {
	cfg, err := restConfig(kubeconfig, opts)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("create Kubernetes client: %w", err)
	}
	return client, nil
}

func restConfig(kubeconfig string, opts ClientOptions) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %q: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst, cfg.DisableCompression = opts.QPS, opts.Burst, opts.NoCompression
	switch opts.ContentType {
	case "", ContentTypeJSON:
	case ContentTypeProtobuf:
		cfg.ContentType = ContentTypeProtobuf
		cfg.AcceptContentTypes = ContentTypeProtobuf + "," + ContentTypeJSON
	default:
		return nil, fmt.Errorf("API content type %q: use %s or %s", opts.ContentType, ContentTypeProtobuf, ContentTypeJSON)
	}
	return cfg, nil
}

// Registry returns a registry with the Go and process collectors.
func Registry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Profiling says what ServeMetrics serves beside the metrics.
type Profiling struct {
	// Enabled serves Go's profiles on /debug/pprof/ (CPU, heap,
	// goroutines, execution trace).
	Enabled bool
	// Contention also samples where goroutines block and which mutexes
	// they wait for (/debug/pprof/block and /debug/pprof/mutex); it costs
	// a little on every contended lock.
	Contention bool
}

// AddFlags adds --profiling and --contention-profiling, named as the
// Kubernetes components name them.
func (p *Profiling) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&p.Enabled, "profiling", p.Enabled, "Serve Go's pprof profiles on the metrics address under /debug/pprof/. Off by default: whoever reaches the port can read the process's internals and load its CPU.")
	fs.BoolVar(&p.Contention, "contention-profiling", p.Contention, "With --profiling, also sample blocking and mutex contention (/debug/pprof/block and /debug/pprof/mutex).")
}

// Validate refuses contention profiling without profiling.
func (p Profiling) Validate() error {
	if p.Contention && !p.Enabled {
		return errors.New("--contention-profiling needs --profiling: the profiles are served with the other pprof endpoints")
	}
	return nil
}

// Readiness says whether the process is ready, and in a word or a line
// what it is doing.
type Readiness func() (ready bool, status string)

// ServeMetrics serves reg on addr/metrics, ready on addr/readyz (200 when
// ready, 503 when not, the status as the body; not served when ready is
// nil), and the pprof profiles on addr/debug/pprof/ when prof says so,
// until the returned function is called; an empty addr serves nothing.
func ServeMetrics(ctx context.Context, addr string, reg *prometheus.Registry, prof Profiling, ready Readiness) (stop func()) {
	if addr == "" {
		return func() {}
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	if ready != nil {
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
			ok, status := ready()
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			if !ok {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
			_, _ = io.WriteString(w, status+"\n")
		})
	}
	if prof.Enabled {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		if prof.Contention {
			runtime.SetBlockProfileRate(int(time.Millisecond)) // one sample per blocked millisecond
			runtime.SetMutexProfileFraction(10)
		}
	}
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "Metrics server stopped", "address", addr)
		}
	}()
	return func() { _ = srv.Close() }
}
