//! Reading what the agent needs about a process from /proc: executable
//! memory mappings, the executable, the cgroup and what the cgroup path says
//! about containers, systemd units and Kubernetes pods.
//!
//! Every parser here takes text and never panics on malformed input; the
//! readers return `io::Error` when the process is gone.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// What backs an executable mapping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Backing {
    /// A file: its path as the process sees it, device and inode.
    File { path: String, dev: u64, inode: u64 },
    /// The vDSO.
    Vdso,
    /// Anonymous memory (JIT code), or a special mapping other than the vDSO.
    Anon(String),
}

/// One executable mapping of /proc/<pid>/maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mapping {
    pub(crate) start: u64,
    pub(crate) end: u64,
    /// File offset of `start`.
    pub(crate) offset: u64,
    pub(crate) backing: Backing,
}

/// Parses the executable mappings of /proc/<pid>/maps text, sorted by start.
/// Malformed lines are skipped.
pub(crate) fn parse_maps(text: &str) -> Vec<Mapping> {
    let mut out = Vec::new();
    for line in text.lines() {
        if let Some(m) = parse_maps_line(line) {
            out.push(m);
        }
    }
    out.sort_by_key(|m| m.start);
    out
}

fn parse_maps_line(line: &str) -> Option<Mapping> {
    // 55d0c8a00000-55d0c8a21000 r-xp 00002000 08:01 1234   /usr/bin/x (deleted)
    let mut it = line.splitn(6, ' ');
    let range = it.next()?;
    let perms = it.next()?;
    let offset = it.next()?;
    let dev = it.next()?;
    let inode = it.next()?;
    let path = it.next().map(str::trim_start).unwrap_or("");
    if perms.as_bytes().get(2) != Some(&b'x') {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    if end <= start {
        return None;
    }
    let offset = u64::from_str_radix(offset, 16).ok()?;
    let (major, minor) = dev.split_once(':')?;
    let dev = (u64::from_str_radix(major, 16).ok()? << 32) | u64::from_str_radix(minor, 16).ok()?;
    let inode: u64 = inode.parse().ok()?;
    let backing = if path == "[vdso]" {
        Backing::Vdso
    } else if inode != 0 && path.starts_with('/') {
        Backing::File {
            path: path.to_owned(),
            dev,
            inode,
        }
    } else if path.is_empty() {
        Backing::Anon("[anon]".into())
    } else {
        Backing::Anon(path.to_owned())
    };
    Some(Mapping {
        start,
        end,
        offset,
        backing,
    })
}

/// The mapping containing `addr`, by binary search.
#[cfg(test)]
pub(crate) fn find_mapping(maps: &[Mapping], addr: u64) -> Option<&Mapping> {
    let i = maps.partition_point(|m| m.start <= addr).checked_sub(1)?;
    let m = &maps[i];
    (addr < m.end).then_some(m)
}

/// The cgroup path of a process from /proc/<pid>/cgroup text: the cgroup v2
/// path when there is one that is not the root, else the systemd (name=systemd)
/// hierarchy, else the first non-root path.
pub(crate) fn parse_cgroup(text: &str) -> String {
    let mut v2 = None;
    let mut systemd = None;
    let mut first = None;
    for line in text.lines() {
        let mut it = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        if path.is_empty() || path == "/" {
            continue;
        }
        if id == "0" && controllers.is_empty() {
            v2 = Some(path);
        } else if controllers == "name=systemd" {
            systemd = Some(path);
        } else if first.is_none() {
            first = Some(path);
        }
    }
    v2.or(systemd).or(first).unwrap_or("/").to_owned()
}

/// What a cgroup path says about where a process runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CgroupInfo {
    /// 64-hex container id (Docker, containerd, CRI-O, Podman).
    pub(crate) container_id: Option<String>,
    /// The innermost systemd service unit (`nginx.service`).
    pub(crate) systemd_unit: Option<String>,
    /// The Kubernetes pod UID, with dashes.
    pub(crate) pod_uid: Option<String>,
}

/// Reads container, systemd and pod identity out of a cgroup path. Handles
/// the cgroupfs layout (`/docker/<id>`, `/kubepods/burstable/pod<uid>/<id>`)
/// and the systemd one (`docker-<id>.scope`, `cri-containerd-<id>.scope`,
/// `crio-<id>.scope`, `libpod-<id>.scope`,
/// `kubepods-burstable-pod<uid_with_underscores>.slice`).
pub(crate) fn parse_cgroup_path(path: &str) -> CgroupInfo {
    let mut info = CgroupInfo::default();
    for comp in path.split('/') {
        if comp.is_empty() {
            continue;
        }
        let base = comp
            .strip_suffix(".scope")
            .or_else(|| comp.strip_suffix(".slice"))
            .unwrap_or(comp);
        // A container id: 64 hex chars, possibly after a runtime prefix.
        let candidate = base.rsplit(['-', ':']).next().unwrap_or(base);
        if is_container_id(candidate) {
            info.container_id = Some(candidate.to_owned());
        }
        if let Some(unit) = comp.strip_suffix(".service")
            && !unit.is_empty()
        {
            info.systemd_unit = Some(comp.to_owned());
        }
        if let Some(pos) = base.rfind("pod") {
            let uid = base[pos + 3..].replace('_', "-");
            if is_uuid(&uid) {
                info.pod_uid = Some(uid);
            }
        }
    }
    info
}

fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, &c)| match i {
            8 | 13 | 18 | 23 => c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// Kubernetes identity that a container's filesystem reveals: the namespace
/// from the mounted service account, and the pod name from the hostname
/// (which the kubelet sets to the pod name unless the pod overrides it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct KubeInfo {
    pub(crate) namespace: Option<String>,
    pub(crate) pod: Option<String>,
}

pub(crate) fn read_kube_info(root: &Path) -> KubeInfo {
    let read = |p: &str| {
        fs::read_to_string(root.join(p))
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty() && s.len() <= 253)
    };
    KubeInfo {
        namespace: read("var/run/secrets/kubernetes.io/serviceaccount/namespace"),
        pod: read("etc/hostname"),
    }
}

/// /proc/<pid>, or under another /proc mount (tests).
#[derive(Clone, Debug)]
pub(crate) struct Proc {
    root: PathBuf,
}

impl Default for Proc {
    fn default() -> Self {
        Proc {
            root: PathBuf::from("/proc"),
        }
    }
}

impl Proc {
    pub(crate) fn pid_dir(&self, pid: u32) -> PathBuf {
        self.root.join(pid.to_string())
    }

    pub(crate) fn maps(&self, pid: u32) -> io::Result<Vec<Mapping>> {
        Ok(parse_maps(&fs::read_to_string(
            self.pid_dir(pid).join("maps"),
        )?))
    }

    pub(crate) fn exe(&self, pid: u32) -> io::Result<String> {
        let p = fs::read_link(self.pid_dir(pid).join("exe"))?;
        let s = p.to_string_lossy();
        Ok(s.strip_suffix(" (deleted)").unwrap_or(&s).to_owned())
    }

    pub(crate) fn cgroup(&self, pid: u32) -> io::Result<String> {
        Ok(parse_cgroup(&fs::read_to_string(
            self.pid_dir(pid).join("cgroup"),
        )?))
    }

    /// The command line, arguments joined by spaces, at most `max` bytes.
    pub(crate) fn cmdline(&self, pid: u32, max: usize) -> io::Result<String> {
        let raw = fs::read(self.pid_dir(pid).join("cmdline"))?;
        let mut s: String = String::from_utf8_lossy(&raw)
            .split('\0')
            .filter(|a| !a.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        if s.len() > max {
            let mut cut = max;
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            s.truncate(cut);
        }
        Ok(s)
    }

    /// The innermost pid of the process in its pid namespace (NSpid), which
    /// is the pid a JIT names its perf map after.
    pub(crate) fn ns_pid(&self, pid: u32) -> io::Result<u32> {
        let status = fs::read_to_string(self.pid_dir(pid).join("status"))?;
        Ok(parse_ns_pid(&status).unwrap_or(pid))
    }

    /// Where the process's root directory is, as seen from the agent.
    pub(crate) fn root_dir(&self, pid: u32) -> PathBuf {
        self.pid_dir(pid).join("root")
    }

    pub(crate) fn alive(&self, pid: u32) -> bool {
        self.pid_dir(pid).exists()
    }
}

fn parse_ns_pid(status: &str) -> Option<u32> {
    let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
    line["NSpid:".len()..]
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// This host's name, for the `node` label.
pub(crate) fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps() {
        let text = "\
55d0c8a00000-55d0c8a02000 r--p 00000000 08:01 1234                       /usr/bin/prog
55d0c8a02000-55d0c8a21000 r-xp 00002000 08:01 1234                       /usr/bin/prog
7f1e00000000-7f1e00021000 rwxp 00000000 00:00 0 
7f1e10000000-7f1e10100000 r-xp 00010000 fd:02 99 /usr/lib/with space/libx.so (deleted)
7ffc1c5f2000-7ffc1c5f4000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
bogus
zz-yy r-xp 0 0:0 0
";
        let m = parse_maps(text);
        assert_eq!(m.len(), 5);
        assert_eq!(m[0].start, 0x55d0c8a02000);
        assert_eq!(m[0].offset, 0x2000);
        assert_eq!(
            m[0].backing,
            Backing::File {
                path: "/usr/bin/prog".into(),
                dev: (8 << 32) | 1,
                inode: 1234
            }
        );
        assert_eq!(m[1].backing, Backing::Anon("[anon]".into()));
        match &m[2].backing {
            Backing::File { path, dev, .. } => {
                assert_eq!(path, "/usr/lib/with space/libx.so (deleted)");
                assert_eq!(*dev, (0xfd << 32) | 2);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(m[3].backing, Backing::Vdso);
        assert_eq!(m[4].backing, Backing::Anon("[vsyscall]".into()));
        assert_eq!(
            find_mapping(&m, 0x55d0c8a02000).unwrap().start,
            0x55d0c8a02000
        );
        assert!(find_mapping(&m, 0x55d0c8a21000).is_none());
        assert!(find_mapping(&m, 0x10).is_none());
    }

    #[test]
    fn real_maps_of_self() {
        let m = Proc::default().maps(std::process::id()).unwrap();
        let here = real_maps_of_self as *const () as u64;
        let hit = find_mapping(&m, here).expect("own code is mapped");
        assert!(matches!(hit.backing, Backing::File { .. }));
    }

    #[test]
    fn cgroup_selection() {
        let hybrid = "\
9:name=systemd:/system.slice/nginx.service
4:memory:/foo
0::/
";
        assert_eq!(parse_cgroup(hybrid), "/system.slice/nginx.service");
        let v2 = "0::/system.slice/docker-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope\n";
        assert!(parse_cgroup(v2).starts_with("/system.slice/docker-"));
        assert_eq!(parse_cgroup("garbage"), "/");
        assert_eq!(parse_cgroup(""), "/");
    }

    #[test]
    fn cgroup_paths() {
        let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let docker = parse_cgroup_path(&format!("/system.slice/docker-{id}.scope"));
        assert_eq!(docker.container_id.as_deref(), Some(id));
        assert_eq!(docker.systemd_unit, None);

        let cgroupfs = parse_cgroup_path(&format!("/docker/{id}"));
        assert_eq!(cgroupfs.container_id.as_deref(), Some(id));

        let k8s_systemd = parse_cgroup_path(&format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_0000_1111_2222_333344445555.slice/cri-containerd-{id}.scope"
        ));
        assert_eq!(k8s_systemd.container_id.as_deref(), Some(id));
        assert_eq!(
            k8s_systemd.pod_uid.as_deref(),
            Some("1b2c3d4e-0000-1111-2222-333344445555")
        );

        let k8s_fs = parse_cgroup_path(&format!(
            "/kubepods/besteffort/pod1b2c3d4e-0000-1111-2222-333344445555/{id}"
        ));
        assert_eq!(k8s_fs.container_id.as_deref(), Some(id));
        assert_eq!(
            k8s_fs.pod_uid.as_deref(),
            Some("1b2c3d4e-0000-1111-2222-333344445555")
        );

        let crio = parse_cgroup_path(&format!("/kubepods.slice/crio-{id}.scope"));
        assert_eq!(crio.container_id.as_deref(), Some(id));

        let unit = parse_cgroup_path(
            "/user.slice/user-1000.slice/user@1000.service/app.slice/foo.service",
        );
        assert_eq!(unit.systemd_unit.as_deref(), Some("foo.service"));
        assert_eq!(unit.container_id, None);
        assert_eq!(parse_cgroup_path("/"), CgroupInfo::default());
        assert_eq!(
            parse_cgroup_path("/podnotauid/.service"),
            CgroupInfo::default()
        );
    }

    #[test]
    fn ns_pid() {
        assert_eq!(parse_ns_pid("Name:\tx\nNSpid:\t4242\t7\n"), Some(7));
        assert_eq!(parse_ns_pid("NSpid:\t4242\n"), Some(4242));
        assert_eq!(parse_ns_pid("Name: x\n"), None);
    }

    #[test]
    fn kube_info_from_root() {
        let dir = tempfile::tempdir().unwrap();
        let sa = dir
            .path()
            .join("var/run/secrets/kubernetes.io/serviceaccount");
        fs::create_dir_all(&sa).unwrap();
        fs::write(sa.join("namespace"), "shop\n").unwrap();
        fs::create_dir_all(dir.path().join("etc")).unwrap();
        fs::write(dir.path().join("etc/hostname"), "cart-7d9f-abcde\n").unwrap();
        assert_eq!(
            read_kube_info(dir.path()),
            KubeInfo {
                namespace: Some("shop".into()),
                pod: Some("cart-7d9f-abcde".into())
            }
        );
    }

    #[test]
    fn cmdline_is_truncated_on_char_boundary() {
        let s = Proc::default().cmdline(std::process::id(), 5).unwrap();
        assert!(s.len() <= 5);
    }
}
