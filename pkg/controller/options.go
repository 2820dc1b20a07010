package controller

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/spf13/pflag"

	"github.com/gputopo/gputopo/pkg/command"
	"github.com/gputopo/gputopo/pkg/labelmapping"
	"github.com/gputopo/gputopo/pkg/nodepin"
)

// Options are the controller's command-line flags.
type Options struct {
	Kubeconfig              string
	MetricsAddress          string
	Profiling               command.Profiling
	LeaderElect             bool
	LeaderElectionNamespace string
	LeaderElectionIdentity  string
	RetryInterval           time.Duration
	BindTimeout             time.Duration
	SettleDelay             time.Duration
	ReserveAfter            time.Duration
	ReservationTimeout      time.Duration
	KubeAPIQPS              float32
	KubeAPIBurst            int
	KubeAPICompression      bool
	KubeAPIContentType      string
	ClaimNodeSelectors      bool
	LabelMapping            labelmapping.Options
	AllocationMode          string
	ConcurrentGroupWrites   int
}

// NewOptions returns the defaults for a controller in a pod: the leader
// Lease in the pod's namespace, named after the pod.
func NewOptions() *Options {
	identity := os.Getenv("POD_NAME")
	if identity == "" {
		identity, _ = os.Hostname()
	}
	return &Options{
		MetricsAddress:          ":9401",
		LeaderElect:             true,
		LeaderElectionNamespace: command.Namespace(),
		LeaderElectionIdentity:  identity,
		RetryInterval:           30 * time.Second,
		BindTimeout:             60 * time.Second,
		SettleDelay:             250 * time.Millisecond,
		ReserveAfter:            30 * time.Second,
		ReservationTimeout:      5 * time.Minute,
		KubeAPIQPS:              300,
		KubeAPIContentType:      command.ContentTypeProtobuf,
		KubeAPIBurst:            600,
		ClaimNodeSelectors:      true,
		LabelMapping:            labelmapping.NewOptions(),
		AllocationMode:          string(AllocationAuto),
		ConcurrentGroupWrites:   16,
	}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "Kubeconfig file; empty uses the in-cluster configuration.")
	fs.StringVar(&o.MetricsAddress, "metrics-address", o.MetricsAddress, "Address serving Prometheus metrics on /metrics; empty disables it.")
	o.Profiling.AddFlags(fs)
	fs.BoolVar(&o.LeaderElect, "leader-elect", o.LeaderElect, "Run only while holding the leader Lease, so replicas never plan at the same time.")
	fs.StringVar(&o.LeaderElectionNamespace, "leader-election-namespace", o.LeaderElectionNamespace, "Namespace of the leader Lease (default $POD_NAMESPACE, else kube-system).")
	fs.StringVar(&o.LeaderElectionIdentity, "leader-election-identity", o.LeaderElectionIdentity, "This replica's name in the Lease (default $POD_NAME, else the host name).")
	fs.DurationVar(&o.RetryInterval, "retry-interval", o.RetryInterval, "How often groups that did not fit are planned again; a group's retries back off up to this.")
	fs.DurationVar(&o.BindTimeout, "bind-timeout", o.BindTimeout, "How long a pod whose gate opened may take to bind before a NotBound Warning event reports it (the scheduler takes back the claims of a pod it cannot place, and the controller plans it again).")
	fs.DurationVar(&o.SettleDelay, "settle-delay", o.SettleDelay, "How long gates stay closed after a group's claims are written and seen, so that an allocation kube-scheduler had in flight lands first and the group is planned again around it. 0 opens them at once; a clash after the gates opened is resolved either way (the pod that has not started gives way), but a deleted pod counts as a failure of its Job.")
	fs.DurationVar(&o.ReserveAfter, "reserve-after", o.ReserveAfter, "How long the first waiting group (by pod priority, then namespaces in turn, oldest first) waits before it reserves the nodes it needs in the domain closest to fitting it, which groups that are not running may not use until it is placed.")
	fs.DurationVar(&o.ReservationTimeout, "reservation-timeout", o.ReservationTimeout, "How long a reservation lasts unplaced; then the next waiting group may reserve, and this one may again after as long.")
	fs.Float32Var(&o.KubeAPIQPS, "kube-api-qps", o.KubeAPIQPS, "Requests per second to the API server. Placing a pod costs about three writes (its claim's finalizer and allocation, its gate), so the default keeps a burst of 1,000 Jobs from waiting on this limit; the API server's priority and fairness still protects it.")
	fs.IntVar(&o.KubeAPIBurst, "kube-api-burst", o.KubeAPIBurst, "Burst of requests to the API server, so a large group is pinned and released at once.")
	fs.StringVar(&o.KubeAPIContentType, "kube-api-content-type", o.KubeAPIContentType, "Content type of requests to and responses from the API server: "+command.ContentTypeProtobuf+" (as kube-scheduler and kube-controller-manager use; every API the controller reads is built in) or "+command.ContentTypeJSON+". Protobuf saves the API server and the controller the CPU of encoding and decoding every watched pod, claim and slice as JSON.")
	fs.BoolVar(&o.KubeAPICompression, "kube-api-compression", o.KubeAPICompression, "Ask the API server for gzip-compressed responses. Off by default: the controller watches every ResourceSlice, pod and claim, and compressing them costs the API server and the controller CPU for bytes that stay inside the cluster.")
	fs.BoolVar(&o.ClaimNodeSelectors, "claim-node-selectors", o.ClaimNodeSelectors, "Keep, in each namespace whose ResourceClaimTemplates or ResourceClaims select a leaf or spine by CEL equality, the ConfigMap "+nodepin.ConfigMapName+" that the gputopo-claim-node-selector admission policy reads to give new pods the equivalent node selector, so kube-scheduler filters them by label before it runs the claim's CEL on every node.")
	fs.StringVar(&o.AllocationMode, "allocation-mode", o.AllocationMode, "Who writes the devices of a placed group into its ResourceClaims: controller (gputopo, all or nothing for every group), scheduler (kube-scheduler, within the domain gputopo chose, all or nothing only for groups with a gang PodGroup), or auto (scheduler for groups whose pods name a gang PodGroup where the API server serves PodGroups, controller for the rest).")
	fs.IntVar(&o.ConcurrentGroupWrites, "concurrent-group-writes", o.ConcurrentGroupWrites, "How many groups' writes (claim allocations, then gates) may be in flight while the controller plans the next groups; a plan's devices count as taken from the plan on. 0 makes each group's writes before the next plan, so a burst of groups is placed at the pace of the API server's latency.")
	o.LabelMapping.AddFlags(fs)
}

// Config is the controller's configuration from the options; the caller
// adds the client, the label mapping in force and the metrics.
func (o *Options) Config() Config {
	return Config{RetryInterval: o.RetryInterval, BindTimeout: o.BindTimeout, SettleDelay: o.SettleDelay, ReserveAfter: o.ReserveAfter, ReservationTimeout: o.ReservationTimeout,
		ClaimNodeSelectors: o.ClaimNodeSelectors, AllocationMode: AllocationMode(o.AllocationMode), WritingGroups: o.ConcurrentGroupWrites}
}

// Validate reports every bad flag at once.
func (o *Options) Validate() error {
	var errs []error
	if err := o.Profiling.Validate(); err != nil {
		errs = append(errs, err)
	}
	if o.RetryInterval <= 0 {
		errs = append(errs, fmt.Errorf("--retry-interval must be positive, got %s", o.RetryInterval))
	}
	if o.BindTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--bind-timeout must be positive, got %s", o.BindTimeout))
	}
	if o.SettleDelay < 0 {
		errs = append(errs, fmt.Errorf("--settle-delay must not be negative, got %s", o.SettleDelay))
	}
	if o.ReserveAfter <= 0 {
		errs = append(errs, fmt.Errorf("--reserve-after must be positive, got %s", o.ReserveAfter))
	}
	if o.ReservationTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--reservation-timeout must be positive, got %s", o.ReservationTimeout))
	}
	if o.KubeAPIQPS <= 0 || o.KubeAPIBurst <= 0 {
		errs = append(errs, fmt.Errorf("--kube-api-qps and --kube-api-burst must be positive, got %g and %d", o.KubeAPIQPS, o.KubeAPIBurst))
	}
	if o.ConcurrentGroupWrites < 0 {
		errs = append(errs, fmt.Errorf("--concurrent-group-writes must not be negative, got %d", o.ConcurrentGroupWrites))
	}
	if o.LeaderElect && (o.LeaderElectionNamespace == "" || o.LeaderElectionIdentity == "") {
		errs = append(errs, errors.New("--leader-elect needs --leader-election-namespace and --leader-election-identity"))
	}
	if !slices.Contains(AllocationModes, AllocationMode(o.AllocationMode)) {
		errs = append(errs, fmt.Errorf("--allocation-mode must be auto, controller or scheduler, got %q", o.AllocationMode))
	}
	if err := o.LabelMapping.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
