//! Turning off receive coalescing and segmentation offloads on the bridged interfaces.
//!
//! The emulator must see each wire frame as one frame: with GRO or LRO on, the kernel merges
//! consecutive TCP segments into one large frame before the emulator reads it, so loss would
//! hit many packets at once and the rate would be charged per super-frame. TSO/GSO are turned
//! off for the same reason on anything the emulator sends. The previous settings are restored
//! when the emulator exits. (The lab also turns TSO/GSO/checksum offload off on the routers'
//! interfaces facing the link, which the emulator cannot reach from its namespace.)

use crate::socket::{if_ioctl, IfReq};
use std::io;

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GTSO: u32 = 0x1e;
const ETHTOOL_STSO: u32 = 0x1f;
const ETHTOOL_GGSO: u32 = 0x23;
const ETHTOOL_SGSO: u32 = 0x24;
const ETHTOOL_GFLAGS: u32 = 0x25;
const ETHTOOL_SFLAGS: u32 = 0x26;
const ETHTOOL_GGRO: u32 = 0x2b;
const ETHTOOL_SGRO: u32 = 0x2c;
const ETH_FLAG_LRO: u32 = 1 << 15;

#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

fn ethtool(ifname: &str, cmd: u32, data: u32) -> io::Result<u32> {
    let mut v = EthtoolValue { cmd, data };
    let mut r = IfReq::new(ifname)?;
    r.data = &mut v as *mut EthtoolValue as usize;
    if_ioctl(SIOCETHTOOL, &mut r)?;
    Ok(v.data)
}

/// Settings changed on interfaces, to be put back with [`Offloads::restore`].
#[derive(Default)]
pub struct Offloads {
    changed: Vec<(String, u32, u32)>,
}

impl Offloads {
    /// Turns off GRO, LRO, GSO and TSO on `ifname`, remembering what was on. Fails if one
    /// that is on cannot be turned off (the emulator would then see merged frames).
    pub fn disable(&mut self, ifname: &str) -> io::Result<()> {
        for (get, set, what) in [
            (ETHTOOL_GGRO, ETHTOOL_SGRO, "GRO"),
            (ETHTOOL_GGSO, ETHTOOL_SGSO, "GSO"),
            (ETHTOOL_GTSO, ETHTOOL_STSO, "TSO"),
        ] {
            match ethtool(ifname, get, 0) {
                Ok(0) => {}
                Ok(old) => {
                    ethtool(ifname, set, 0).map_err(|e| {
                        io::Error::new(e.kind(), format!("cannot turn {what} off on {ifname}: {e}"))
                    })?;
                    self.changed.push((ifname.into(), set, old));
                }
                // Drivers without the ethtool operation do not do it.
                Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {}
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("cannot read {what} setting of {ifname}: {e}"),
                    ))
                }
            }
        }
        if let Ok(flags) = ethtool(ifname, ETHTOOL_GFLAGS, 0) {
            if flags & ETH_FLAG_LRO != 0 {
                ethtool(ifname, ETHTOOL_SFLAGS, flags & !ETH_FLAG_LRO).map_err(|e| {
                    io::Error::new(e.kind(), format!("cannot turn LRO off on {ifname}: {e}"))
                })?;
                self.changed.push((ifname.into(), ETHTOOL_SFLAGS, flags));
            }
        }
        Ok(())
    }

    /// Puts back every setting changed, newest first. Errors are ignored: the interface may be
    /// gone already (e.g. its namespace was deleted).
    pub fn restore(&mut self) {
        while let Some((ifname, set, old)) = self.changed.pop() {
            let _ = ethtool(&ifname, set, old);
        }
    }
}

/// Whether GRO is on for `ifname` (for tests and diagnostics).
pub fn gro_enabled(ifname: &str) -> io::Result<bool> {
    ethtool(ifname, ETHTOOL_GGRO, 0).map(|v| v != 0)
}
