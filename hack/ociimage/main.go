// Command ociimage builds a container image without Docker or a registry:
// each --layer directory becomes one layer (its tree is the image's /), on
// no base image, and the image is written as an OCI image layout tarball
// that `ctr images import` (containerd) and `docker load` (Docker 25+)
// read, named --ref.
//
//	ociimage --ref ghcr.io/gputopo/gputopo:0.1.0 --out gputopo.oci.tar \
//	    --layer _output/image/base --layer _output/image/bin \
//	    --entrypoint /usr/bin/gputopo --user 65532:65532 --label org.opencontainers.image.version=0.1.0
//
// The layers are reproducible: entries sorted by path, owned by 0:0, with
// modification time --epoch (default SOURCE_DATE_EPOCH, else 0), so the same
// files give the same digests. hack/build-image-oci.sh drives it.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	var opts options
	var layers, labels, env stringList
	flag.StringVar(&opts.ref, "ref", "", "image reference to name the image by, REPOSITORY:TAG (required)")
	flag.StringVar(&opts.out, "out", "", "OCI image layout tarball to write (required)")
	flag.Var(&layers, "layer", "directory whose tree is one layer, lowest first (repeatable; at least one)")
	flag.Var(&labels, "label", "image label KEY=VALUE (repeatable)")
	flag.Var(&env, "env", "environment variable KEY=VALUE of the image (repeatable; default PATH=/usr/local/bin:/usr/bin:/bin)")
	entrypoint := flag.String("entrypoint", "", "entrypoint program (one word)")
	flag.StringVar(&opts.user, "user", "", "user the image runs as, UID[:GID]")
	flag.StringVar(&opts.arch, "arch", "amd64", "architecture of the binaries in the layers")
	epoch := flag.String("epoch", os.Getenv("SOURCE_DATE_EPOCH"), "modification and creation time, seconds since 1970 (default SOURCE_DATE_EPOCH, else 0)")
	flag.Parse()
	if flag.NArg() != 0 {
		fail(fmt.Errorf("unexpected arguments %q; every input is a flag (-h lists them)", flag.Args()))
	}
	opts.layers = layers
	opts.env = env
	if len(opts.env) == 0 {
		opts.env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	}
	if *entrypoint != "" {
		opts.entrypoint = []string{*entrypoint}
	}
	opts.labels = map[string]string{}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			fail(fmt.Errorf("--label %q: want KEY=VALUE", l))
		}
		opts.labels[k] = v
	}
	if *epoch != "" {
		sec, err := strconv.ParseInt(*epoch, 10, 64)
		if err != nil {
			fail(fmt.Errorf("--epoch (or SOURCE_DATE_EPOCH) %q: want seconds since 1970: %w", *epoch, err))
		}
		opts.epoch = time.Unix(sec, 0).UTC()
	} else {
		opts.epoch = time.Unix(0, 0).UTC()
	}
	b, err := build(opts)
	if err != nil {
		fail(err)
	}
	fmt.Printf("ociimage: wrote %s: %s manifest %s config %s\n", opts.out, opts.ref, b.manifest, b.config)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "ociimage:", err)
	os.Exit(1)
}

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }
