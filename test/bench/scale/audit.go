package scale

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// auditPolicy logs the metadata of every write, once, when it completes.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: Metadata
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
- level: None
`

// auditEvent is the part of an audit.k8s.io/v1 Event the count needs.
type auditEvent struct {
	Stage     string    `json:"stage"`
	Verb      string    `json:"verb"`
	UserAgent string    `json:"userAgent"`
	Received  time.Time `json:"requestReceivedTimestamp"`
	User      struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
}

// readAudit calls each of each, in one pass over the log, for every
// request the audit log records as completed, received in [from, to].
func readAudit(path string, from, to time.Time, each ...func(ev *auditEvent)) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open audit log: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for line := 1; sc.Scan(); line++ {
		var ev auditEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return fmt.Errorf("audit log %s line %d: %w", path, line, err)
		}
		if ev.Stage != "ResponseComplete" || ev.Received.Before(from) || ev.Received.After(to) {
			continue
		}
		for _, f := range each {
			f(&ev)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read audit log %s: %w", path, err)
	}
	return nil
}

// ReadAudit reads the log once for both CountAuditWrites and PodStages.
func ReadAudit(path string, from, to time.Time) (map[string]map[string]int, []StageSummary, error) {
	writes, stages := writeCounts{}, newPodWays()
	if err := readAudit(path, from, to, writes.add, stages.add); err != nil {
		return nil, nil, err
	}
	return writes, stages.summary(), nil
}

// CountAuditWrites counts the writes received in [from, to] by client and
// "verb resource[/subresource]".
func CountAuditWrites(path string, from, to time.Time) (map[string]map[string]int, error) {
	out := writeCounts{}
	return out, readAudit(path, from, to, out.add)
}

// writeCounts counts writes by client and "verb resource[/subresource]".
type writeCounts map[string]map[string]int

func (out writeCounts) add(ev *auditEvent) {
	what := ev.Verb
	if ev.ObjectRef != nil {
		what += " " + ev.ObjectRef.Resource
		if ev.ObjectRef.Subresource != "" {
			what += "/" + ev.ObjectRef.Subresource
		}
	}
	who := Client(ev.UserAgent, ev.User.Username)
	if out[who] == nil {
		out[who] = map[string]int{}
	}
	out[who][what]++
}

// StageSummary is how long the pods of a burst spent in one stage of
// their way from their Job's create request to their binding.
type StageSummary struct {
	Stage              string
	Pods               int
	P50, P90, P99, Max float64
}

// Stages of a pod's way, each ended by one client's write (PodStages).
const (
	StageClaims = "Job created → claims created (kube-controller-manager: Job and claim controllers)"
	StageGate   = "claims created → gate opened (gputopo controller)"
	StageBind   = "gate opened → bound (kube-scheduler)"
	// Paths without gputopo have no gate: the scheduler's stage starts
	// when the claims are created, or, for pods without claims, when the
	// Job is.
	StageBindNoGate   = "claims created → bound (kube-scheduler)"
	StageBindNoClaims = "Job created → bound (Job controller, kube-scheduler)"
)

// PodStages splits the wait of every pod bound in [from, to] at the
// writes that end each stage, from the audit log: its Job's create
// request, the claim controller's write of the pod's claims into its
// status, the controller's last write of the pod (the one that opens its
// gate) and its binding. A pod's stages are those whose ends are in the
// log: on paths without gputopo the scheduler's stage starts at the
// claims (StageBindNoGate), or without claims at the Job
// (StageBindNoClaims). Indexed Jobs' pods are named after their Job,
// index and a random suffix.
func PodStages(path string, from, to time.Time) ([]StageSummary, error) {
	ways := newPodWays()
	if err := readAudit(path, from, to, ways.add); err != nil {
		return nil, err
	}
	return ways.summary(), nil
}

// podWays collects, from audit events, when each Job was created and
// when each pod reached the end of each stage (PodStages).
type podWays struct {
	jobs map[podKey]time.Time
	pods map[podKey]*podWay
}

type podKey struct{ ns, name string }

type podWay struct{ claims, gate, bound time.Time }

func newPodWays() *podWays {
	return &podWays{jobs: map[podKey]time.Time{}, pods: map[podKey]*podWay{}}
}

func (p *podWays) at(k podKey) *podWay {
	if p.pods[k] == nil {
		p.pods[k] = &podWay{}
	}
	return p.pods[k]
}

func (p *podWays) add(ev *auditEvent) {
	o := ev.ObjectRef
	if o == nil || ev.ResponseStatus.Code >= 300 {
		return
	}
	k := podKey{o.Namespace, o.Name}
	who := Client(ev.UserAgent, ev.User.Username)
	switch {
	case o.Resource == "jobs" && o.Subresource == "" && ev.Verb == "create" && who == "benchscale":
		p.jobs[k] = ev.Received
	case o.Resource != "pods":
	case o.Subresource == "status" && who == "kube-controller-manager resource-claim-controller":
		if w := p.at(k); w.claims.IsZero() {
			w.claims = ev.Received
		}
	case o.Subresource == "" && ev.Verb == "patch" && who == "gputopo-controller":
		if w := p.at(k); w.bound.IsZero() {
			w.gate = ev.Received
		}
	case o.Subresource == "binding":
		p.at(k).bound = ev.Received
	}
}

func (p *podWays) summary() []StageSummary {
	spans := map[string][]float64{}
	for k, w := range p.pods {
		if w.bound.IsZero() {
			continue
		}
		job := k.name
		for range 2 {
			if i := strings.LastIndexByte(job, '-'); i > 0 {
				job = job[:i]
			}
		}
		created, ok := p.jobs[podKey{k.ns, job}]
		if !ok {
			continue
		}
		bind := StageBind
		switch {
		case w.claims.IsZero() && w.gate.IsZero():
			bind = StageBindNoClaims
		case w.gate.IsZero():
			bind = StageBindNoGate
		}
		prev := created
		for _, st := range []struct {
			name string
			end  time.Time
		}{{StageClaims, w.claims}, {StageGate, w.gate}, {bind, w.bound}} {
			if st.end.IsZero() {
				continue
			}
			spans[st.name] = append(spans[st.name], st.end.Sub(prev).Seconds())
			prev = st.end
		}
	}
	var out []StageSummary
	for _, name := range []string{StageClaims, StageGate, StageBind, StageBindNoGate, StageBindNoClaims} {
		xs := spans[name]
		if len(xs) == 0 {
			continue
		}
		q := func(p float64) float64 { return percentile(xs, p) }
		out = append(out, StageSummary{Stage: name, Pods: len(xs), P50: q(0.5), P90: q(0.9), P99: q(0.99), Max: slices.Max(xs)})
	}
	return out
}

// Client names who made a request: the program of its user agent, and for
// kube-controller-manager the controller, from its service account.
func Client(userAgent, username string) string {
	prog, _, _ := strings.Cut(userAgent, "/")
	if prog == "" {
		prog = "unknown"
	}
	if sa, ok := strings.CutPrefix(username, "system:serviceaccount:kube-system:"); ok && prog == "kube-controller-manager" {
		return prog + " " + sa
	}
	return prog
}
