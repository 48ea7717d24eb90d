//! The key-value callbacks of `PJRT_Client_Create`: C functions that call a [`KeyValueStore`].
//!
//! `user_arg` points at a boxed `Arc<dyn KeyValueStore>` that the client keeps until it is destroyed. A value
//! handed to the plugin is a heap copy with its length stored in front of it, since the plugin's deleter
//! callback gets only the pointer.

use std::alloc::{alloc, dealloc, Layout};
use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::Arc;
use std::time::Duration;

use super::layout as c;
use crate::error::ErrorCode;
use crate::key_value::{KeyValueError, KeyValueStore};

/// What `PJRT_Client_Create_Args` takes: the three callbacks and their common `user_arg`.
pub(crate) struct Callbacks {
    pub get: *const c_void,
    pub try_get: *const c_void,
    pub put: *const c_void,
    pub user_arg: *mut c_void,
}

/// The callbacks for `store`, which must stay at its address (boxed) and outlive the client (`ClientInner` keeps
/// the box).
pub(crate) fn callbacks(store: &Arc<dyn KeyValueStore>) -> Callbacks {
    let get: c::KeyValueGetCallback = kv_get;
    let try_get: c::KeyValueTryGetCallback = kv_try_get;
    let put: c::KeyValuePutCallback = kv_put;
    Callbacks {
        get: get as *const c_void,
        try_get: try_get as *const c_void,
        put: put as *const c_void,
        user_arg: ptr::from_ref::<Arc<dyn KeyValueStore>>(store).cast_mut().cast(),
    }
}

const HEADER: usize = std::mem::size_of::<usize>();

fn value_layout(len: usize) -> Layout {
    Layout::from_size_align(HEADER + len.max(1), std::mem::align_of::<usize>()).expect("a value's size fits")
}

/// A heap copy of `value` the plugin frees through `free_value`.
fn value_for_plugin(value: &[u8]) -> *mut c_char {
    let layout = value_layout(value.len());
    // SAFETY: the layout has a non-zero size; the header and the bytes are written inside the allocation.
    unsafe {
        let p = alloc(layout);
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        p.cast::<usize>().write(value.len());
        ptr::copy_nonoverlapping(value.as_ptr(), p.add(HEADER), value.len());
        p.add(HEADER).cast()
    }
}

extern "C" fn free_value(value: *mut c_char) {
    if value.is_null() {
        return;
    }
    // SAFETY: `value` came from `value_for_plugin`, whose header holds the length it was allocated with.
    unsafe {
        let p = value.cast::<u8>().sub(HEADER);
        let len = p.cast::<usize>().read();
        dealloc(p, value_layout(len));
    }
}

/// The store behind `user_arg`, and the key.
///
/// SAFETY (for callers): `user_arg` is the pointer `callbacks` made, `key` points at `key_size` bytes.
unsafe fn store_and_key<'a>(
    user_arg: *mut c_void,
    key: *const c_char,
    key_size: usize,
) -> (&'a dyn KeyValueStore, String) {
    let store = &**user_arg.cast::<Arc<dyn KeyValueStore>>();
    let key = if key.is_null() { &[][..] } else { std::slice::from_raw_parts(key.cast::<u8>(), key_size) };
    (store, String::from_utf8_lossy(key).into_owned())
}

/// Turns a store's error (or a panic in it) into the plugin's error through its `callback_error`.
fn plugin_error(callback_error: *const c::PJRT_CallbackError, error: KeyValueError) -> *mut c::PJRT_Error {
    // SAFETY: the plugin passes a pointer to its error constructor, or null.
    let Some(make) = (unsafe { callback_error.as_ref() }).copied().flatten() else {
        return ptr::null_mut();
    };
    // SAFETY: the constructor copies the message during the call.
    unsafe { make(error.code.to_raw(), error.message.as_ptr().cast(), error.message.len()) }
}

fn guarded<T>(f: impl FnOnce() -> Result<T, KeyValueError>) -> Result<T, KeyValueError> {
    catch_unwind(AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err(KeyValueError::new(ErrorCode::Internal, "the key-value store panicked")))
}

extern "C" fn kv_get(args: *mut c::PJRT_KeyValueGetCallback_Args) -> *mut c::PJRT_Error {
    // SAFETY: the plugin passes a valid argument struct for the call's duration.
    let args = unsafe { &mut *args };
    // SAFETY: `user_arg` is ours (`callbacks`); the key is the plugin's.
    let (store, key) = unsafe { store_and_key(args.user_arg, args.key, args.key_size) };
    let timeout = Duration::from_millis(u64::try_from(args.timeout_in_ms).unwrap_or(0));
    match guarded(|| store.get(&key, timeout)) {
        Ok(value) => {
            args.value_size = value.len();
            args.value = value_for_plugin(&value);
            args.value_deleter_callback = Some(free_value);
            ptr::null_mut()
        }
        Err(e) => plugin_error(args.callback_error, e),
    }
}

extern "C" fn kv_try_get(args: *mut c::PJRT_KeyValueTryGetCallback_Args) -> *mut c::PJRT_Error {
    // SAFETY: as in `kv_get`.
    let args = unsafe { &mut *args };
    // SAFETY: as in `kv_get`.
    let (store, key) = unsafe { store_and_key(args.user_arg, args.key, args.key_size) };
    match guarded(|| store.try_get(&key)) {
        Ok(Some(value)) => {
            args.value_size = value.len();
            args.value = value_for_plugin(&value);
            args.value_deleter_callback = Some(free_value);
            ptr::null_mut()
        }
        Ok(None) => {
            plugin_error(args.callback_error, KeyValueError::new(ErrorCode::NotFound, format!("{key} not found")))
        }
        Err(e) => plugin_error(args.callback_error, e),
    }
}

extern "C" fn kv_put(args: *mut c::PJRT_KeyValuePutCallback_Args) -> *mut c::PJRT_Error {
    // SAFETY: as in `kv_get`.
    let args = unsafe { &mut *args };
    // SAFETY: as in `kv_get`.
    let (store, key) = unsafe { store_and_key(args.user_arg, args.key, args.key_size) };
    let value = if args.value.is_null() {
        Vec::new()
    } else {
        // SAFETY: the plugin passes `value_size` readable bytes, alive for the call.
        unsafe { std::slice::from_raw_parts(args.value.cast::<u8>(), args.value_size) }.to_vec()
    };
    match guarded(|| store.put(&key, &value)) {
        Ok(()) => ptr::null_mut(),
        Err(e) => plugin_error(args.callback_error, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicI32, Ordering::Relaxed};
    use std::sync::Mutex;

    #[derive(Default)]
    struct Memory(Mutex<HashMap<String, Vec<u8>>>);

    impl KeyValueStore for Memory {
        fn get(&self, key: &str, _: Duration) -> Result<Vec<u8>, KeyValueError> {
            self.try_get(key)?.ok_or_else(|| KeyValueError::new(ErrorCode::DeadlineExceeded, "timed out"))
        }
        fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, KeyValueError> {
            Ok(self.0.lock().unwrap().get(key).cloned())
        }
        fn put(&self, key: &str, value: &[u8]) -> Result<(), KeyValueError> {
            self.0.lock().unwrap().insert(key.to_string(), value.to_vec());
            Ok(())
        }
    }

    static LAST_CODE: AtomicI32 = AtomicI32::new(0);

    /// Stands in for the plugin's error constructor: records the code, returns a non-null marker.
    unsafe extern "C" fn record_error(code: c::CEnum, _: *const c_char, _: usize) -> *mut c::PJRT_Error {
        LAST_CODE.store(code, Relaxed);
        ptr::NonNull::dangling().as_ptr()
    }

    /// The callbacks as the plugin calls them: put, get and try-get through the argument structs, values
    /// copied out and freed with the returned deleter, a missing key as the plugin's NOT_FOUND and
    /// DEADLINE_EXCEEDED errors.
    #[test]
    fn callbacks_store_and_return_values() {
        let store: Box<Arc<dyn KeyValueStore>> = Box::new(Arc::new(Memory::default()));
        let kv = callbacks(&store);
        let make_error: c::PJRT_CallbackError = Some(record_error);
        let (key, value) = ("topology/0", b"\x00some bytes\xff");

        let mut put = c::PJRT_KeyValuePutCallback_Args::new();
        (put.key, put.key_size, put.value, put.value_size) =
            (key.as_ptr().cast(), key.len(), value.as_ptr().cast(), value.len());
        (put.callback_error, put.user_arg) = (&make_error, kv.user_arg);
        assert!(kv_put(&mut put).is_null());

        let mut get = c::PJRT_KeyValueGetCallback_Args::new();
        (get.key, get.key_size, get.timeout_in_ms) = (key.as_ptr().cast(), key.len(), 10);
        (get.callback_error, get.user_arg) = (&make_error, kv.user_arg);
        assert!(kv_get(&mut get).is_null());
        // SAFETY: the callback returned `value_size` bytes at `value`.
        let got = unsafe { std::slice::from_raw_parts(get.value.cast::<u8>(), get.value_size) }.to_vec();
        assert_eq!(got, value);
        (get.value_deleter_callback.unwrap())(get.value);

        let missing = "never/set";
        let mut try_get = c::PJRT_KeyValueTryGetCallback_Args::new();
        (try_get.key, try_get.key_size) = (missing.as_ptr().cast(), missing.len());
        (try_get.callback_error, try_get.user_arg) = (&make_error, kv.user_arg);
        assert!(!kv_try_get(&mut try_get).is_null());
        assert_eq!(LAST_CODE.load(Relaxed), ErrorCode::NotFound.to_raw());

        (get.key, get.key_size) = (missing.as_ptr().cast(), missing.len());
        assert!(!kv_get(&mut get).is_null());
        assert_eq!(LAST_CODE.load(Relaxed), ErrorCode::DeadlineExceeded.to_raw());
    }

    #[test]
    fn values_handed_to_the_plugin_round_trip_and_free() {
        for value in [&b""[..], b"x", b"a longer value with some bytes \x00\xff"] {
            let p = value_for_plugin(value);
            // SAFETY: `p` holds `value.len()` bytes.
            let back = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), value.len()) };
            assert_eq!(back, value);
            free_value(p);
        }
    }
}
