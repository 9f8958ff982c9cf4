// libcni-driver runs one libcni operation the way a container runtime does, so the
// black-box tests (tests/tests/libcni.rs) can drive our plugins through the real
// runtime-side library: config list loading, prevResult chaining, capability args,
// CNI_ARGS, the result cache (prevResult for CHECK and DEL comes from it), version
// probing.
//
// Built offline against Debian's golang-github-appc-cni-dev (libcni 1.1.2):
//
//	GOPATH=/usr/share/gocode GO111MODULE=off go build -o libcni-driver .
//
// Usage:
//
//	libcni-driver add|check|del|cached -conflist F -netns P -id ID -ifname IF \
//	    -path DIR:DIR -cache-dir D [-args 'K=V;K=V'] [-cap-args JSON]
//	libcni-driver validate -conflist F -path DIR:DIR
//	libcni-driver version|find -plugin TYPE -path DIR:DIR
//
// On success the command prints its JSON (add: the result; cached: the cached result;
// validate: the sorted capabilities; version: cniVersion and supportedVersions; find:
// the path libcni would execute) on stdout and exits 0. On failure it prints the error
// on stderr and exits 1. The plugins' stderr passes through to ours.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
)

func main() {
	if len(os.Args) < 2 {
		fail(fmt.Errorf("usage: %s add|check|del|cached|validate|version|find [flags]", filepath.Base(os.Args[0])))
	}
	command := os.Args[1]
	flags := flag.NewFlagSet(command, flag.ContinueOnError)
	conflist := flags.String("conflist", "", "network config list file")
	netns := flags.String("netns", "", "pod netns path (CNI_NETNS)")
	containerID := flags.String("id", "", "container id (CNI_CONTAINERID)")
	ifname := flags.String("ifname", "eth0", "interface name (CNI_IFNAME)")
	path := flags.String("path", "", "CNI_PATH: directories separated by ':'")
	args := flags.String("args", "", "CNI_ARGS as a runtime sends them: K=V;K=V")
	capArgs := flags.String("cap-args", "", "capability args, a JSON object")
	cacheDir := flags.String("cache-dir", "", "libcni result cache dir")
	plugin := flags.String("plugin", "", "plugin type, for version and find")
	if err := flags.Parse(os.Args[2:]); err != nil {
		fail(err)
	}
	if flags.NArg() != 0 {
		fail(fmt.Errorf("unexpected arguments: %q", flags.Args()))
	}

	var dirs []string
	if *path != "" {
		dirs = filepath.SplitList(*path)
	}
	cni := libcni.NewCNIConfigWithCacheDir(dirs, *cacheDir, nil)
	ctx := context.Background()

	switch command {
	case "version":
		info, err := cni.GetVersionInfo(ctx, *plugin)
		if err != nil {
			fail(err)
		}
		if err := info.Encode(os.Stdout); err != nil {
			fail(err)
		}
		return
	case "find":
		found, err := invoke.FindInPath(*plugin, dirs)
		if err != nil {
			fail(err)
		}
		printJSON(found)
		return
	}

	list, err := libcni.ConfListFromFile(*conflist)
	if err != nil {
		fail(err)
	}
	if command == "validate" {
		caps, err := cni.ValidateNetworkList(ctx, list)
		if err != nil {
			fail(err)
		}
		sort.Strings(caps)
		printJSON(caps)
		return
	}

	rt := &libcni.RuntimeConf{
		ContainerID: *containerID,
		NetNS:       *netns,
		IfName:      *ifname,
		Args:        parseArgs(*args),
	}
	if *capArgs != "" {
		if err := json.Unmarshal([]byte(*capArgs), &rt.CapabilityArgs); err != nil {
			fail(fmt.Errorf("-cap-args: %w", err))
		}
	}

	switch command {
	case "add":
		result, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			fail(err)
		}
		printResult(result)
	case "check":
		if err := cni.CheckNetworkList(ctx, list, rt); err != nil {
			fail(err)
		}
	case "del":
		if err := cni.DelNetworkList(ctx, list, rt); err != nil {
			fail(err)
		}
	case "cached":
		result, err := cni.GetNetworkListCachedResult(list, rt)
		if err != nil {
			fail(err)
		}
		if result == nil {
			fmt.Print("null")
			return
		}
		printResult(result)
	default:
		fail(fmt.Errorf("unknown command %q", command))
	}
}

// parseArgs splits "K=V;K=V" into the pairs libcni joins again for CNI_ARGS.
func parseArgs(text string) [][2]string {
	var pairs [][2]string
	if text == "" {
		return pairs
	}
	for _, pair := range strings.Split(text, ";") {
		kv := strings.SplitN(pair, "=", 2)
		if len(kv) != 2 {
			fail(fmt.Errorf("-args: invalid pair %q", pair))
		}
		pairs = append(pairs, [2]string{kv[0], kv[1]})
	}
	return pairs
}

// printResult prints a result as the runtime holds it (its own version's JSON).
func printResult(result types.Result) {
	if err := result.PrintTo(os.Stdout); err != nil {
		fail(err)
	}
}

func printJSON(v interface{}) {
	text, err := json.Marshal(v)
	if err != nil {
		fail(err)
	}
	fmt.Println(string(text))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}
