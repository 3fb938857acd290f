//! The resource types of the core objects the manager knows without a model file:
//! LwM2M Server (1) and Device (3), as LwM2M 1.1 defines them. Formats that carry
//! no type (TLV, plain text) are typed from here; resources of other objects decode
//! as opaque bytes (TLV) or text (plain text).

use crate::value::Kind;

/// LwM2M Server object (1): resource types by id.
const SERVER: &[Kind] = &[
    Kind::Integer,    // 0 Short Server ID
    Kind::Integer,    // 1 Lifetime
    Kind::Integer,    // 2 Default Minimum Period
    Kind::Integer,    // 3 Default Maximum Period
    Kind::Execute,    // 4 Disable
    Kind::Integer,    // 5 Disable Timeout
    Kind::Boolean,    // 6 Notification Storing When Disabled or Offline
    Kind::String,     // 7 Binding
    Kind::Execute,    // 8 Registration Update Trigger
    Kind::Execute,    // 9 Bootstrap-Request Trigger
    Kind::ObjectLink, // 10 APN Link
    Kind::Unsigned,   // 11 TLS-DTLS Alert Code
    Kind::Time,       // 12 Last Bootstrapped
    Kind::Unsigned,   // 13 Registration Priority Order
    Kind::Unsigned,   // 14 Initial Registration Delay Timer
    Kind::Boolean,    // 15 Registration Failure Block
    Kind::Boolean,    // 16 Bootstrap on Registration Failure
    Kind::Unsigned,   // 17 Communication Retry Count
    Kind::Unsigned,   // 18 Communication Retry Timer
    Kind::Unsigned,   // 19 Communication Sequence Delay Timer
    Kind::Unsigned,   // 20 Communication Sequence Retry Count
    Kind::Boolean,    // 21 Trigger
    Kind::String,     // 22 Preferred Transport
    Kind::Boolean,    // 23 Mute Send
];

/// Device object (3): resource types by id.
const DEVICE: &[Kind] = &[
    Kind::String,     // 0 Manufacturer
    Kind::String,     // 1 Model Number
    Kind::String,     // 2 Serial Number
    Kind::String,     // 3 Firmware Version
    Kind::Execute,    // 4 Reboot
    Kind::Execute,    // 5 Factory Reset
    Kind::Integer,    // 6 Available Power Sources
    Kind::Integer,    // 7 Power Source Voltage
    Kind::Integer,    // 8 Power Source Current
    Kind::Integer,    // 9 Battery Level
    Kind::Integer,    // 10 Memory Free
    Kind::Integer,    // 11 Error Code
    Kind::Execute,    // 12 Reset Error Code
    Kind::Time,       // 13 Current Time
    Kind::String,     // 14 UTC Offset
    Kind::String,     // 15 Timezone
    Kind::String,     // 16 Supported Binding and Modes
    Kind::String,     // 17 Device Type
    Kind::String,     // 18 Hardware Version
    Kind::String,     // 19 Software Version
    Kind::Integer,    // 20 Battery Status
    Kind::Integer,    // 21 Memory Total
    Kind::ObjectLink, // 22 ExtDevInfo
];

/// The declared type of resource `resource` of object `object`, where it is known.
pub fn resource_kind(object: u16, resource: u16) -> Option<Kind> {
    let table = match object {
        1 => SERVER,
        3 => DEVICE,
        _ => return None,
    };
    table.get(usize::from(resource)).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_objects_are_typed_and_others_are_not() {
        assert_eq!(resource_kind(3, 13), Some(Kind::Time));
        assert_eq!(resource_kind(3, 4), Some(Kind::Execute));
        assert_eq!(resource_kind(1, 1), Some(Kind::Integer));
        assert_eq!(resource_kind(1, 7), Some(Kind::String));
        assert_eq!(resource_kind(3, 99), None);
        assert_eq!(resource_kind(3303, 5700), None);
    }
}
