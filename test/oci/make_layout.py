#!/usr/bin/env python3
"""Builds an OCI image layout by hand for test/oci (no tool between the test and
the bytes): python's tarfile for each layer, sha256 for every blob, the JSON
documents of the OCI image spec.

    make_layout.py SPEC.json

SPEC: {"dir": LAYOUT, "images": [IMAGE...]}
IMAGE: {"tag": T, "platform": "linux/amd64" (optional), "config": {Env, Cmd, ...},
        "layers": [LAYER...]}
LAYER: {"compress": "gzip" | "none", "entries": [ENTRY...]}
    or {"compress": ..., "tree": HOST_DIR}: a host directory tree as it is
    (owners, modes, times, links), device nodes left out (an image's /dev is
    empty: the runtime makes its own)
ENTRY: {"name": N, "type": "file"|"dir"|"symlink"|"hardlink"|"fifo"|"chardev",
        "content": S, "source": HOST_FILE, "target": S, "mode": M, "uid": U, "gid": G, "mtime": T}

Images sharing a tag and naming platforms are put under one index (a
multi-arch image); the layout's index.json names each tag once. The same
LAYER always gives the same bytes (mtime 0, gzip without a name or time), so
two images that list it share its blob. Prints one line per image:
"TAG PLATFORM MANIFEST_DIGEST LAYER_DIGEST...".
"""
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile


def blob(layout, data):
    digest = hashlib.sha256(data).hexdigest()
    path = os.path.join(layout, "blobs", "sha256", digest)
    with open(path, "wb") as f:
        f.write(data)
    return "sha256:" + digest


def layer_tar(entries):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            info = tarfile.TarInfo(e["name"])
            info.mtime = e.get("mtime", 0)
            info.uid = e.get("uid", 0)
            info.gid = e.get("gid", 0)
            t = e.get("type", "file")
            data = None
            if t == "file":
                if "source" in e:
                    data = open(e["source"], "rb").read()
                else:
                    data = e.get("content", "").encode()
                info.size = len(data)
                info.mode = e.get("mode", 0o644)
            elif t == "dir":
                info.type = tarfile.DIRTYPE
                info.mode = e.get("mode", 0o755)
            elif t == "symlink":
                info.type = tarfile.SYMTYPE
                info.linkname = e["target"]
                info.mode = 0o777
            elif t == "hardlink":
                info.type = tarfile.LNKTYPE
                info.linkname = e["target"]
                info.mode = e.get("mode", 0o644)
            elif t == "fifo":
                info.type = tarfile.FIFOTYPE
                info.mode = 0o644
            elif t == "chardev":
                info.type = tarfile.CHRTYPE
                info.devmajor, info.devminor = e.get("dev", [1, 3])
                info.mode = 0o666
            if "xattrs" in e:
                info.pax_headers = {"SCHILY.xattr." + k: v for k, v in e["xattrs"].items()}
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def tree_tar(root):
    buf = io.BytesIO()

    def keep(info):
        return None if info.ischr() or info.isblk() else info

    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in sorted(os.listdir(root)):
            tar.add(os.path.join(root, entry), arcname=entry, filter=keep)
    return buf.getvalue()


def main():
    spec = json.load(open(sys.argv[1]))
    layout = spec["dir"]
    os.makedirs(os.path.join(layout, "blobs", "sha256"), exist_ok=True)
    with open(os.path.join(layout, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    by_tag = {}
    for image in spec["images"]:
        layers, diff_ids = [], []
        for layer in image["layers"]:
            if "tree" in layer:
                tar = tree_tar(layer["tree"])
            else:
                tar = layer_tar(layer["entries"])
            diff_ids.append("sha256:" + hashlib.sha256(tar).hexdigest())
            if layer.get("compress", "gzip") == "gzip":
                data = gzip.compress(tar, mtime=0)
                mt = "application/vnd.oci.image.layer.v1.tar+gzip"
            else:
                data = tar
                mt = "application/vnd.oci.image.layer.v1.tar"
            layers.append({"mediaType": mt, "digest": blob(layout, data), "size": len(data)})
        os_, arch = image.get("platform", "linux/amd64").split("/")[:2]
        config = {
            "architecture": arch, "os": os_,
            "config": image.get("config", {}),
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }
        cdata = json.dumps(config).encode()
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": blob(layout, cdata), "size": len(cdata)},
            "layers": layers,
        }
        mdata = json.dumps(manifest).encode()
        mdesc = {"mediaType": "application/vnd.oci.image.manifest.v1+json",
                 "digest": blob(layout, mdata), "size": len(mdata)}
        if "platform" in image:
            mdesc["platform"] = {"os": os_, "architecture": arch}
        by_tag.setdefault(image["tag"], []).append(mdesc)
        print(image["tag"], image.get("platform", "-"), mdesc["digest"],
              " ".join(l["digest"] for l in layers))
    manifests = []
    for tag, descs in by_tag.items():
        if len(descs) == 1 and "platform" not in descs[0]:
            d = dict(descs[0])
        else:
            idx = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                   "manifests": descs}
            idata = json.dumps(idx).encode()
            d = {"mediaType": "application/vnd.oci.image.index.v1+json",
                 "digest": blob(layout, idata), "size": len(idata)}
        d["annotations"] = {"org.opencontainers.image.ref.name": tag}
        manifests.append(d)
    with open(os.path.join(layout, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "manifests": manifests}, f)


if __name__ == "__main__":
    main()
